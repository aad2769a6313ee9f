//! The one error type of the client library.

use gpumux_proto::{ErrorKind, ErrorReply, FrameError};
use std::path::PathBuf;

/// What can go wrong talking to gpumuxd. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (no file, or a stale one), also after
    /// waiting `waited` for a daemon starting to listen
    /// ([`crate::ConnectOptions::wait_for_daemon`]).
    #[error("no daemon listens on {}{}: start one with `gpumuxd` or set GPUMUX_SOCKET", socket.display(), waited_for(*waited))]
    NoDaemon {
        /// The path tried.
        socket: PathBuf,
        /// How long the library waited for it to appear ([`crate::ConnectOptions::wait_for_daemon`]).
        waited: std::time::Duration,
        /// What `connect` said.
        #[source]
        source: std::io::Error,
    },
    /// The socket exists but could not be opened (permissions, not a socket).
    #[error("cannot connect to {}: {cause} (check the socket's permissions, or set GPUMUX_SOCKET)", socket.display())]
    Connect {
        /// The path tried.
        socket: PathBuf,
        /// What `connect` said (in the message, which C callers get, so not
        /// also the error's source: printed with its chain it came twice).
        cause: std::io::Error,
    },
    /// Reading from or writing to the daemon failed (a reset or a broken
    /// pipe is [`ClientError::DaemonGone`]: `From<std::io::Error>`).
    #[error("talking to gpumuxd failed: {0}")]
    Io(std::io::Error),
    /// The daemon closed the connection, or it was closed after an earlier error.
    #[error(
        "gpumuxd closed the connection (it stopped, or it disconnected this client after a bad request: see its log)"
    )]
    DaemonGone,
    /// The daemon closed the connection and said why first: a uid the
    /// config does not allow (`NotPermitted`, at connect), a broken protocol
    /// rule. [`ClientError::kind`] gives the kind; the message is the daemon's.
    #[error("gpumuxd closed the connection: {}", error.message)]
    Closed {
        /// What the daemon said.
        error: ErrorReply,
    },
    /// A frame could not be encoded or decoded (the cause is in the
    /// message, which C callers read, so it is not also the source).
    #[error(
        "a frame to or from gpumuxd is malformed: {0} (are the client library and the daemon the same gpumux version?)"
    )]
    Frame(FrameError),
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
    #[error("cannot create the shared-memory region of {bytes} bytes: {cause}")]
    Shm {
        /// Its size.
        bytes: u64,
        /// What the system said (in the message, not also the error's source).
        cause: std::io::Error,
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

/// A reset or a broken pipe is the daemon's end of the connection, as an
/// end of stream is: which one a client sees depends on whether the daemon
/// closed its end with bytes of the client's still unread (a reset) or not.
impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        ClientError::Frame(e)
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => ClientError::DaemonGone,
            _ => ClientError::Io(e),
        }
    }
}

/// ` (waited 2s for one to start)`, or nothing when the library did not wait.
fn waited_for(waited: std::time::Duration) -> String {
    if waited.is_zero() {
        String::new()
    } else {
        format!(" (waited {waited:?} for one to start)")
    }
}

impl ClientError {
    /// The daemon's kind of error, if the daemon answered with one (or said
    /// one as it closed the connection).
    pub fn kind(&self) -> Option<&ErrorKind> {
        match self {
            ClientError::Daemon { error, .. } | ClientError::Closed { error } => Some(&error.kind),
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
            | ClientError::Closed { .. }
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

#[cfg(test)]
mod tests {
    use super::ClientError;
    use std::io::{Error, ErrorKind};

    #[test]
    fn a_reset_or_a_broken_pipe_is_the_daemon_gone_and_other_io_errors_stay_io() {
        for kind in [ErrorKind::ConnectionReset, ErrorKind::BrokenPipe] {
            assert!(matches!(ClientError::from(Error::from(kind)), ClientError::DaemonGone), "{kind:?}");
        }
        let other = ClientError::from(Error::from(ErrorKind::PermissionDenied));
        assert!(matches!(other, ClientError::Io(ref e) if e.kind() == ErrorKind::PermissionDenied), "{other}");
        assert!(other.is_fatal());
    }
}
