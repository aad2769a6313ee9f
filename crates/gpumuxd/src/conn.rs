//! One client connection's byte stream, with no I/O: bytes and received
//! descriptors in, decoded requests (or the rule the client broke) out.
//!
//! The reader thread feeds it what `recvmsg` returned; tests and the fuzz
//! target feed it bytes directly, so the whole request path up to the core
//! runs without a socket. Rules enforced here, before the core sees a thing:
//! every frame's length is in range and its body decodes completely, the
//! first request is `Hello` and no other request is. A broken rule yields
//! one [`Inbound::Violation`] and the connection ignores everything after it.

use gpumux_proto::{decode_frame_body, ClientFrame, ErrorKind, ErrorReply, FrameReader, Request, VERSION};
use std::collections::VecDeque;
use std::os::fd::OwnedFd;

/// Descriptors a client may have in flight before we call it abuse: one
/// region at a time is what the protocol needs (the client library attaches
/// its regions one at a time), a few more is slack.
const MAX_PENDING_FDS: usize = 4;

/// What a connection yields.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed request, in turn. `fd` is the memfd that came with an
    /// `AttachShm`, `AttachHost` or `UseRings` (`None` if none did; that is refused).
    Request {
        /// The client's id for the reply.
        id: u64,
        /// The request.
        request: Request,
        /// The descriptor sent with it (only for `AttachShm`, `AttachHost` and `UseRings`).
        fd: Option<OwnedFd>,
    },
    /// The client broke a rule: send it this error and disconnect it.
    Violation(ErrorReply),
    /// A request the reader thread answered itself (`UseRings`): the core
    /// only sends the answer, in turn with the others.
    Answered {
        /// The client's id for the reply.
        id: u64,
        /// The answer.
        result: Result<gpumux_proto::Reply, ErrorReply>,
    },
    /// A request refused before the core saw it (a `Hello` pinned to a GPU
    /// the daemon does not serve: `gpus.rs`): the core sends the error as
    /// the request's reply and disconnects the client.
    Refused {
        /// The client's id for the reply.
        id: u64,
        /// Why.
        error: ErrorReply,
    },
}

/// Bytes of a request's or reply's variable contents that count one unit of
/// the daemon's `outstanding` limit beyond the frame's own unit.
pub const COST_UNIT_BYTES: usize = 4096;

impl Inbound {
    /// What this counts against the connection's `outstanding` limit
    /// (`config::ServerLimits`) from the moment its reader hands it to the
    /// core until the core takes it: one, plus one per [`COST_UNIT_BYTES`]
    /// of a module's source and options, a launch's arguments or a name.
    pub fn cost(&self) -> u64 {
        let payload = match self {
            Inbound::Request { request, .. } => match request {
                Request::LoadModule { name, source, options } => {
                    name.len() + source.len() + options.iter().map(String::len).sum::<usize>()
                }
                Request::Launch(l) | Request::LaunchSplit { launch: l, .. } => {
                    l.args.iter().map(gpumux_proto::Arg::size).sum()
                }
                Request::Hello { name, .. } => name.len(),
                _ => 0,
            },
            Inbound::Violation(_) | Inbound::Answered { .. } | Inbound::Refused { .. } => 0,
        };
        1 + (payload / COST_UNIT_BYTES) as u64
    }
}

/// The state of one connection's input (see the module doc).
#[derive(Debug, Default)]
pub struct Connection {
    reader: FrameReader,
    /// Descriptors received and not yet claimed by an `AttachShm` or `AttachHost`.
    fds: VecDeque<OwnedFd>,
    greeted: bool,
    broken: bool,
    /// The conversation moved to shared-memory rings: descriptors come on
    /// the socket *before* their frame, so unclaimed ones are kept (up to
    /// [`MAX_PENDING_FDS`]) rather than closed.
    ringed: bool,
    /// Frames decoded so far (names the frame being received: [`Connection::partial_frame`]).
    frames: u64,
}

impl Connection {
    /// A fresh connection, waiting for `Hello`.
    pub fn new() -> Self {
        Connection::default()
    }

    /// Whether a rule was broken (nothing more will be yielded).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// From now on, frames come from the rings and descriptors ahead of them.
    pub fn use_rings(&mut self) {
        self.ringed = true;
    }

    /// Whether [`Connection::use_rings`] was called.
    pub fn is_ringed(&self) -> bool {
        self.ringed
    }

    /// Whether its `Hello` has come (its first frame, decoded).
    pub fn is_greeted(&self) -> bool {
        self.greeted
    }

    /// While part of a frame is held: which frame (its number on the
    /// connection, from 0) and how many of its bytes came; `None` between
    /// frames. The reader's `frame_timeout` runs from when a number first appears.
    pub fn partial_frame(&self) -> Option<(u64, usize)> {
        let held = self.reader.pending();
        (held > 0 && !self.broken).then_some((self.frames, held))
    }

    /// The client broke a rule the reader enforces (a deadline): the same
    /// as a rule broken here, one [`Inbound::Violation`] and nothing after it.
    pub fn violate_now(&mut self, kind: ErrorKind, message: String, out: &mut Vec<Inbound>) {
        if !self.broken {
            self.violate(kind, message, out);
        }
    }

    /// Takes bytes (and descriptors that came with them) and appends what
    /// they complete to `out`.
    pub fn receive(&mut self, bytes: &[u8], fds: Vec<OwnedFd>, out: &mut Vec<Inbound>) {
        self.receive_with(bytes, fds, out, &mut Vec::new)
    }

    /// [`Connection::receive`] for bytes from the rings: an `AttachShm` or `AttachHost` that
    /// finds no descriptor waiting calls `more_fds` (a read of the socket,
    /// where its descriptor was sent before the frame).
    pub fn receive_ringed(&mut self, bytes: &[u8], out: &mut Vec<Inbound>, more_fds: &mut dyn FnMut() -> Vec<OwnedFd>) {
        self.receive_with(bytes, Vec::new(), out, more_fds)
    }

    /// Descriptors read from the socket while no frame asked for them (ringed).
    pub fn take_fds(&mut self, fds: Vec<OwnedFd>, out: &mut Vec<Inbound>) {
        if self.broken {
            return;
        }
        self.fds.extend(fds);
        self.check_fds(out);
    }

    fn check_fds(&mut self, out: &mut Vec<Inbound>) -> bool {
        if self.fds.len() > MAX_PENDING_FDS {
            let n = self.fds.len();
            self.violate(
                ErrorKind::Protocol,
                format!("{n} file descriptors sent without AttachShm or AttachHost requests"),
                out,
            );
            return false;
        }
        true
    }

    fn receive_with(
        &mut self,
        bytes: &[u8],
        fds: Vec<OwnedFd>,
        out: &mut Vec<Inbound>,
        more_fds: &mut dyn FnMut() -> Vec<OwnedFd>,
    ) {
        if self.broken {
            return;
        }
        self.fds.extend(fds);
        if !self.check_fds(out) {
            return;
        }
        self.reader.extend(bytes);
        loop {
            let body = match self.reader.next_body() {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => return self.violate(ErrorKind::BadFrame, e.to_string(), out),
            };
            self.frames += 1;
            let frame: ClientFrame = match decode_frame_body(&body) {
                Ok(f) => f,
                Err(e) => {
                    // An older client's Hello has other fields: name the versions, not the bytes.
                    let older = gpumux_proto::hello_version(&body).filter(|&v| v != VERSION && !self.greeted);
                    if let Some(client) = older {
                        let kind = ErrorKind::Version { daemon: VERSION, client };
                        let msg = format!(
                            "the daemon speaks protocol version {VERSION}, the client {client}: use matching versions"
                        );
                        return self.violate(kind, msg, out);
                    }
                    return self.violate(ErrorKind::BadFrame, e.to_string(), out);
                }
            };
            let is_hello = matches!(frame.request, Request::Hello { .. });
            if is_hello == self.greeted {
                let msg = if is_hello {
                    "a second Hello; a connection has one".to_string()
                } else {
                    format!("{} before Hello; the first request must be Hello", frame.request.name())
                };
                return self.violate(ErrorKind::Protocol, msg, out);
            }
            self.greeted = true;
            let fd = match frame.request {
                // The requests that come with a descriptor.
                Request::AttachShm { .. } | Request::AttachHost { .. } | Request::UseRings { .. } => {
                    if self.fds.is_empty() && self.ringed {
                        let fds = more_fds();
                        self.fds.extend(fds);
                        if !self.check_fds(out) {
                            return;
                        }
                    }
                    self.fds.pop_front()
                }
                _ => None,
            };
            out.push(Inbound::Request { id: frame.id, request: frame.request, fd });
        }
        // A descriptor sent with a frame arrives with the frame's first byte;
        // with no partial frame left, any still unclaimed came with no
        // AttachShm or AttachHost: close them. (Ringed, one may come ahead of its frame.)
        if self.reader.pending() == 0 && !self.ringed {
            self.fds.clear();
        }
    }

    fn violate(&mut self, kind: ErrorKind, message: String, out: &mut Vec<Inbound>) {
        self.broken = true;
        self.fds.clear();
        out.push(Inbound::Violation(ErrorReply::new(kind, message)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_proto::{encode_frame, MAGIC, VERSION};

    fn hello() -> Vec<u8> {
        let request = Request::hello("t", 0);
        encode_frame(&ClientFrame { id: 1, request }).unwrap()
    }

    fn kinds(out: &[Inbound]) -> Vec<Option<ErrorKind>> {
        out.iter()
            .map(|i| match i {
                Inbound::Request { .. } => None,
                Inbound::Violation(e) => Some(e.kind.clone()),
                Inbound::Answered { .. } => None,
                Inbound::Refused { error, .. } => Some(error.kind.clone()),
            })
            .collect()
    }

    #[test]
    fn hello_then_requests_byte_by_byte() {
        let mut c = Connection::new();
        let mut bytes = hello();
        bytes.extend(encode_frame(&ClientFrame { id: 2, request: Request::Status }).unwrap());
        let mut out = Vec::new();
        for b in &bytes {
            c.receive(std::slice::from_ref(b), Vec::new(), &mut out);
        }
        assert_eq!(kinds(&out), vec![None, None]);
    }

    #[test]
    fn a_request_before_hello_and_a_second_hello_break_the_rules() {
        let mut out = Vec::new();
        let status = encode_frame(&ClientFrame { id: 2, request: Request::Status }).unwrap();
        Connection::new().receive(&status, Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![Some(ErrorKind::Protocol)]);
        out.clear();
        let mut c = Connection::new();
        c.receive(&[hello(), hello(), status].concat(), Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![None, Some(ErrorKind::Protocol)]);
        assert!(c.is_broken());
    }

    #[test]
    fn bad_lengths_and_bodies_are_bad_frames_and_end_the_connection() {
        let mut out = Vec::new();
        let mut c = Connection::new();
        c.receive(&[0, 0, 0, 0], Vec::new(), &mut out);
        c.receive(&hello(), Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![Some(ErrorKind::BadFrame)], "nothing after the violation");
        out.clear();
        Connection::new().receive(&[3, 0, 0, 0, 0xff, 0xff, 0xff], Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![Some(ErrorKind::BadFrame)]);
        out.clear();
        Connection::new().receive(&u32::MAX.to_le_bytes(), Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![Some(ErrorKind::BadFrame)]);
    }

    /// A version-6 client's Hello (five fields, not six) is told the versions, not "does not decode".
    #[test]
    fn an_older_clients_hello_is_answered_with_both_versions() {
        let mut body = vec![1u8, 0]; // id 1, variant 0 (Hello)
        body.extend(MAGIC);
        body.push(6); // version 6
        body.extend([1, b't']); // the name
        body.push(0); // priority 0 (zigzag varint)
        body.extend(1.0f64.to_le_bytes());
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend(body);
        let mut out = Vec::new();
        Connection::new().receive(&frame, Vec::new(), &mut out);
        assert_eq!(kinds(&out), vec![Some(ErrorKind::Version { daemon: VERSION, client: 6 })]);
        match out.as_slice() {
            [Inbound::Violation(e)] => {
                assert!(e.message.contains(&format!("version {VERSION}, the client 6")), "{}", e.message)
            }
            other => panic!("{other:?}"),
        }
    }
}
