//! The one error type of the client library.

use gpumux_proto::{ErrorKind, ErrorReply, FrameError};
use std::path::PathBuf;

/// What can go wrong talking to gpumuxd. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (no file, or a stale one).
    #[error("no daemon listens on {}: start one with `gpumuxd` or set GPUMUX_SOCKET", socket.display())]
    NoDaemon {
        /// The path tried.
        socket: PathBuf,
        /// What `connect` said.
        #[source]
        source: std::io::Error,
    },
    /// The socket exists but could not be opened (permissions, not a socket).
    #[error("cannot connect to {}: {source} (check the socket's permissions, or set GPUMUX_SOCKET)", socket.display())]
    Connect {
        /// The path tried.
        socket: PathBuf,
        /// What `connect` said.
        #[source]
        source: std::io::Error,
    },
    /// Reading from or writing to the daemon failed.
    #[error("talking to gpumuxd failed: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon closed the connection, or it was closed after an earlier error.
    #[error(
        "gpumuxd closed the connection (it stopped, or it disconnected this client after a bad request: see its log)"
    )]
    DaemonGone,
    /// A frame could not be encoded or decoded.
    #[error(
        "a frame to or from gpumuxd is malformed: {0} (are the client library and the daemon the same gpumux version?)"
    )]
    Frame(#[from] FrameError),
    /// The daemon answered something this request cannot get.
    #[error("gpumuxd answered {request} with {got} (are the client library and the daemon the same gpumux version?)")]
    Protocol {
        /// The request.
        request: &'static str,
        /// What came back, in words.
        got: String,
    },
    /// The daemon refused the request or it failed there.
    #[error("{request}: {}", error.message)]
    Daemon {
        /// The request that failed.
        request: &'static str,
        /// The daemon's answer.
        error: ErrorReply,
    },
    /// The shared-memory region could not be made (memfd, seals, mmap).
    #[error("cannot create the shared-memory region of {bytes} bytes: {source}")]
    Shm {
        /// Its size.
        bytes: u64,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The module has no kernel of that name.
    #[error("module {module} has no kernel named {name:?}; it has: {}", available.join(", "))]
    NoSuchKernel {
        /// The module's name.
        module: String,
        /// The name asked for.
        name: String,
        /// The kernels it has.
        available: Vec<String>,
    },
    /// The call is wrong before anything is sent (a copy past a buffer's end,
    /// arguments that do not match the kernel, a copy with no shared region).
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    /// The daemon's kind of error, if the daemon answered with one.
    pub fn kind(&self) -> Option<&ErrorKind> {
        match self {
            ClientError::Daemon { error, .. } => Some(&error.kind),
            _ => None,
        }
    }

    /// Whether the connection can still be used after this error.
    pub fn is_fatal(&self) -> bool {
        match self {
            ClientError::NoDaemon { .. }
            | ClientError::Connect { .. }
            | ClientError::Io(_)
            | ClientError::DaemonGone
            | ClientError::Frame(_)
            | ClientError::Protocol { .. } => true,
            ClientError::Daemon { error, .. } => {
                matches!(error.kind, ErrorKind::BadFrame | ErrorKind::Protocol | ErrorKind::ShuttingDown)
            }
            ClientError::Shm { .. } | ClientError::NoSuchKernel { .. } | ClientError::Invalid(_) => false,
        }
    }
}

/// The library's result.
pub type Result<T> = std::result::Result<T, ClientError>;
