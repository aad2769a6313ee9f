//! Frames: a 4-byte little-endian length, then that many bytes of postcard.

use crate::MAX_FRAME_BYTES;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix is 0 or over [`MAX_FRAME_BYTES`]; nothing was read past it.
    #[error("frame length {len} is outside 1..={MAX_FRAME_BYTES}")]
    Length {
        /// The length the prefix claims.
        len: u32,
    },
    /// The body is not a message of the expected type.
    #[error("frame body does not decode: {0}")]
    Decode(String),
    /// The body decoded but bytes were left over.
    #[error("frame body has {0} bytes after the message")]
    Trailing(usize),
    /// A message too large to send (over [`MAX_FRAME_BYTES`] encoded).
    #[error("message of {0} bytes is over the frame limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(usize),
    /// Encoding failed (a type serde cannot write).
    #[error("message does not encode: {0}")]
    Encode(String),
}

/// The capacity an encoded frame starts with: a launch with a few
/// arguments, a sync, a copy fit.
const FIRST_CAPACITY: usize = 128;

/// Encodes `msg` as one frame into `out` (cleared first, its capacity kept):
/// a sender that encodes frame after frame allocates nothing per frame (the
/// daemon's link to its device process sends three or more a launch, issue 35).
/// On an error `out` is left empty.
pub fn encode_frame_into<T: Serialize>(msg: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let mut buf = std::mem::take(out);
    buf.clear();
    buf.extend_from_slice(&[0u8; 4]);
    let mut buf = postcard::to_extend(msg, buf).map_err(|e| FrameError::Encode(e.to_string()))?;
    let body = buf.len() - 4;
    if body > MAX_FRAME_BYTES as usize {
        return Err(FrameError::TooLarge(body));
    }
    buf[..4].copy_from_slice(&(body as u32).to_le_bytes());
    *out = buf;
    Ok(())
}

/// Encodes `msg` as one frame, length prefix included.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    // Room for the length and a small frame's body: postcard grows the
    // vector as it writes, which from 4 bytes was several reallocations on
    // every launch (issue 41).
    let mut out = Vec::with_capacity(FIRST_CAPACITY);
    encode_frame_into(msg, &mut out)?;
    Ok(out)
}

/// Decodes one frame body (without its length prefix) as a `T`; every byte
/// must belong to the message.
pub fn decode_frame_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| FrameError::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Trailing(rest.len()));
    }
    Ok(msg)
}

/// Room a [`FrameReader`] keeps between frames; more is given back once its frame is taken.
const KEEP_CAPACITY: usize = 256 << 10;

/// Cuts a byte stream into frame bodies. Feed it what the socket gave
/// ([`FrameReader::extend`]), then take bodies ([`FrameReader::next_body`])
/// until it has none. A bad length is reported as soon as its 4 bytes are
/// in, before the body is waited for or buffered.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Start of unread bytes in `buf`.
    start: usize,
}

impl FrameReader {
    /// An empty reader.
    pub fn new() -> Self {
        FrameReader::default()
    }

    /// Appends bytes read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that are not yet part of a returned body.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete frame body, `Ok(None)` if more bytes are needed,
    /// or the length error of the next frame (the stream cannot be resynchronised
    /// after it: close the connection).
    pub fn next_body(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let avail = &self.buf[self.start..];
        if avail.len() < 4 {
            self.compact();
            return Ok(None);
        }
        let len = u32::from_le_bytes([avail[0], avail[1], avail[2], avail[3]]);
        if len == 0 || len > MAX_FRAME_BYTES {
            return Err(FrameError::Length { len });
        }
        let end = 4 + len as usize;
        if avail.len() < end {
            self.compact();
            return Ok(None);
        }
        let body = avail[4..end].to_vec();
        self.start += end;
        if self.start == self.buf.len() && self.buf.capacity() > KEEP_CAPACITY {
            // A large frame came and went: its room is not held for the
            // connection's life (the daemon has up to a thousand of them).
            self.buf = Vec::new();
            self.start = 0;
        }
        Ok(Some(body))
    }

    /// Moves unread bytes to the front once the consumed part dominates.
    fn compact(&mut self) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }
}

#[cfg(test)]
mod reader_room {
    use super::*;

    /// A connection that once sent a large frame does not keep its room:
    /// the daemon holds a reader per client, up to a thousand of them.
    #[test]
    fn a_large_frames_room_is_given_back_once_it_is_taken() {
        let mut r = FrameReader::new();
        let body = vec![7u8; 4 << 20];
        r.extend(&(body.len() as u32).to_le_bytes());
        r.extend(&body);
        assert_eq!(r.next_body().unwrap().map(|b| b.len()), Some(body.len()));
        assert!(r.buf.capacity() <= KEEP_CAPACITY, "{} bytes kept", r.buf.capacity());
        r.extend(&[1, 0, 0, 0, 9]);
        assert_eq!(r.next_body().unwrap(), Some(vec![9]));
    }
}
