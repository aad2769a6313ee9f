//! What a copying client is told about the others (issue 35).
//!
//! A client copying from ordinary memory does its staging `memcpy` on
//! several threads of its own, and those take the host's memory bandwidth
//! and cache from the daemon's threads and the other clients. The core
//! knows whether anyone else has work, so each chunk's reply says so
//! ([`Reply::Copied`]), and a client that asked for fewer threads beside
//! others (`ConnectOptions::copy_threads_beside`) takes them only then: one
//! field in a reply it waits for anyway, no request and no message more.
//! By default a client takes all its threads either way: 2 beside others
//! halved the copier's rate on the H200 and did not shorten a chain of
//! short launches beside it beyond its noise (docs/daemon.md, "A pageable
//! copy beside other clients").

use super::*;

/// How long after its last submitted operation a client still counts as
/// busy beside a copy. A program of short launches leaves gaps between its
/// bursts (a sync's round trip, its host's work on the results, the next
/// repetition's set-up) in which nothing of it is in flight; a copier that
/// took all its threads in each gap would meet the next burst with them
/// until its next chunk's reply (a chunk or more later). 50 ms spans such
/// gaps and is little against a large copy (1 GiB alone: 30-40 ms at the
/// H200's rates); a copy that starts within it of another client's last
/// work goes on fewer threads for that long.
pub(super) const BESIDE_WINDOW: Nanos = 50_000_000;

/// Whether a client with `in_flight` operations that last submitted one at
/// `last_submit` counts as busy at `now` (module doc).
fn busy(in_flight: u32, last_submit: Option<Nanos>, now: Nanos) -> bool {
    in_flight > 0 || last_submit.is_some_and(|t| now.saturating_sub(t) < BESIDE_WINDOW)
}

impl Core {
    /// The clients other than `client` that are busy now ([`busy`]).
    fn others_busy(&self, client: u64) -> u32 {
        let now = self.backend.now();
        let others = self
            .sessions
            .values()
            .filter(|s| s.id != client && s.phase == Phase::Open && busy(s.in_flight, s.last_submit, now));
        others.count().try_into().unwrap_or(u32::MAX)
    }

    /// Notes that request `id` of `client` is a staging copy's chunk, queued
    /// as `op`: its reply will be [`Reply::Copied`]. Drops the chunks whose
    /// operation is gone (answered), so the table stays as small as the
    /// client's work in flight.
    pub(super) fn note_chunk(&mut self, client: u64, id: u64, op: OpId) {
        let ops = &self.ops;
        if let Some(s) = self.sessions.get_mut(&client) {
            s.chunks.retain(|_, op| ops.contains_key(op));
            s.chunks.insert(id, op);
        }
    }

    /// `result` as the reply to `s`'s request `id`: a chunk's `Done` becomes
    /// [`Reply::Copied`] with the others busy now; anything else is as it was.
    /// The chunk must still be in flight (its operation known), so a request
    /// id a client used again for something else later is answered `Done`.
    pub(super) fn chunk_reply(
        &self,
        s: &Session,
        id: u64,
        result: Result<Reply, ErrorReply>,
    ) -> Result<Reply, ErrorReply> {
        match result {
            Ok(Reply::Done)
                if !s.chunks.is_empty() && s.chunks.get(&id).is_some_and(|op| self.ops.contains_key(op)) =>
            {
                Ok(Reply::Copied { others: self.others_busy(s.id) })
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_busy_with_work_in_flight_or_lately_submitted() {
        let ms = 1_000_000;
        assert!(!busy(0, None, 0), "never submitted, nothing in flight");
        assert!(!busy(0, None, 10 * BESIDE_WINDOW));
        assert!(busy(1, None, 0), "work in flight");
        assert!(busy(3, Some(0), 10 * BESIDE_WINDOW), "work in flight, however long ago submitted");
        assert!(busy(0, Some(100 * ms), 100 * ms), "just submitted");
        assert!(busy(0, Some(100 * ms), 100 * ms + BESIDE_WINDOW - 1));
        assert!(!busy(0, Some(100 * ms), 100 * ms + BESIDE_WINDOW), "idle for the window");
    }
}
