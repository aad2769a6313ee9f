//! The core's inbox: messages taken from the readers' channel wait here,
//! one queue per client, and are handed out in turn, one per client with
//! work, so one client's flood is served in turn with everyone else's, not
//! before them (issue 36). A client's own messages keep their order; there
//! is no order between clients to keep (nothing a client sends refers to
//! another's work).
//!
//! `Shutdown` belongs to no client and goes first.

use super::id_map::IdMap;
use super::CoreMsg;
use std::collections::VecDeque;

/// Per-client queues and the turn order.
#[derive(Debug, Default)]
pub struct FairInbox {
    /// Keyed by client id: the daemon numbers its clients itself, so the
    /// one-multiply hash of `id_map` serves (SipHash here was ~4% of the
    /// core's time with 8 clients launching, in `pop_where`'s scans).
    queues: IdMap<u64, VecDeque<CoreMsg>>,
    /// Clients with a message waiting, in turn order (each once).
    turn: VecDeque<u64>,
    shutdown: bool,
    len: usize,
    /// Messages pushed and taken so far ([`FairInbox::changes`]).
    changes: u64,
}

/// Whose message it is (`None`: the daemon's own).
fn client_of(msg: &CoreMsg) -> Option<u64> {
    match msg {
        CoreMsg::Connected { client, .. }
        | CoreMsg::Inbound { client, .. }
        | CoreMsg::Disconnected { client }
        | CoreMsg::HandOver { client, .. } => Some(*client),
        CoreMsg::Adopt(h) => Some(h.client()),
        // The daemon's own question (several GPUs: `gpus.rs`), a queue of its own.
        CoreMsg::Status { .. } => Some(u64::MAX),
        // Between cores (a split launch, core/split.rs): a queue of their own.
        CoreMsg::SplitPart(_) | CoreMsg::SplitDone(_) | CoreMsg::SplitRegionGone(_) => Some(u64::MAX - 1),
        CoreMsg::Shutdown => None,
    }
}

impl FairInbox {
    /// Queues `msg` behind its client's earlier ones.
    pub fn push(&mut self, msg: CoreMsg) {
        self.changes += 1;
        let Some(client) = client_of(&msg) else {
            self.shutdown = true;
            return;
        };
        let q = self.queues.entry(client).or_default();
        if q.is_empty() {
            self.turn.push_back(client);
        }
        q.push_back(msg);
        self.len += 1;
    }

    /// The next message: `Shutdown` if it came, else the first of the client
    /// whose turn it is, who then goes to the back of the turn.
    pub fn pop(&mut self) -> Option<CoreMsg> {
        if self.shutdown {
            self.shutdown = false;
            self.changes += 1;
            return Some(CoreMsg::Shutdown);
        }
        // A client in the turn has a queue with a message (push and pop keep
        // it so); one without is skipped rather than end the turn early.
        loop {
            let client = self.turn.pop_front()?;
            let Some(q) = self.queues.get_mut(&client) else { continue };
            let Some(msg) = q.pop_front() else {
                self.queues.remove(&client);
                continue;
            };
            if q.is_empty() {
                self.queues.remove(&client);
            } else {
                self.turn.push_back(client);
            }
            self.len -= 1;
            self.changes += 1;
            return Some(msg);
        }
    }

    /// The first message, in turn, of a client whose next message passes
    /// `take` (the others keep theirs, in order; that client goes to the back
    /// of the turn): how a pump takes the requests it may handle between its
    /// rounds (`Core::take_requests`) without reordering any client's. `None`
    /// while `Shutdown` waits (the core's loop takes it).
    pub fn pop_where(&mut self, take: impl Fn(&CoreMsg) -> bool) -> Option<CoreMsg> {
        if self.shutdown {
            return None;
        }
        let at = self.turn.iter().position(|c| self.queues.get(c).and_then(|q| q.front()).is_some_and(&take))?;
        let client = self.turn.remove(at)?;
        let q = self.queues.get_mut(&client)?;
        let msg = q.pop_front()?;
        if q.is_empty() {
            self.queues.remove(&client);
        } else {
            self.turn.push_back(client);
        }
        self.len -= 1;
        self.changes += 1;
        Some(msg)
    }

    /// Whether some client's next message fails `take` (or `Shutdown` waits):
    /// a message the core's loop must handle is held here.
    pub fn holds_other(&self, take: impl Fn(&CoreMsg) -> bool) -> bool {
        self.shutdown || self.queues.values().any(|q| q.front().is_some_and(|m| !take(m)))
    }

    /// How many messages were pushed and taken so far: a caller that found
    /// nothing with [`FairInbox::pop_where`] finds nothing again with the
    /// same test until this changes (the core's look for requests while a
    /// poll is out skips the scan of every client's first message then).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Whether `msg`'s client has messages waiting here (it may not overtake them).
    pub fn holds_for(&self, msg: &CoreMsg) -> bool {
        client_of(msg).map_or(self.shutdown, |c| self.queues.contains_key(&c))
    }

    /// Messages waiting.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len + usize::from(self.shutdown)
    }

    /// Whether none waits.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gone(client: u64) -> CoreMsg {
        CoreMsg::Disconnected { client }
    }

    fn who(msg: &CoreMsg) -> Option<u64> {
        client_of(msg)
    }

    #[test]
    fn a_flood_is_served_in_turn_with_the_others() {
        let mut inbox = FairInbox::default();
        for _ in 0..100 {
            inbox.push(gone(1));
        }
        inbox.push(gone(2));
        inbox.push(gone(3));
        let first: Vec<_> = (0..4).map(|_| inbox.pop().and_then(|m| who(&m))).collect();
        assert_eq!(
            first,
            [Some(1), Some(2), Some(3), Some(1)],
            "client 2 and 3 wait behind one of client 1's, not 100"
        );
        assert_eq!(inbox.len(), 98, "102 in, 4 out");
    }

    #[test]
    fn shutdown_goes_first() {
        let mut inbox = FairInbox::default();
        inbox.push(gone(1));
        inbox.push(CoreMsg::Shutdown);
        assert!(matches!(inbox.pop(), Some(CoreMsg::Shutdown)));
        assert_eq!(inbox.pop().and_then(|m| who(&m)), Some(1));
        assert!(inbox.pop().is_none());
        assert!(inbox.is_empty());
    }

    #[test]
    fn pop_where_skips_a_client_whose_next_message_fails_and_keeps_its_order() {
        let mut inbox = FairInbox::default();
        // Client 1: a message the pump may not take, then one it may; client 2: two it may.
        inbox.push(gone(1));
        inbox.push(request(1, 1));
        inbox.push(request(2, 2));
        inbox.push(request(2, 3));
        let is_request = |m: &CoreMsg| matches!(m, CoreMsg::Inbound { .. });
        let id = |m: Option<CoreMsg>| match m {
            Some(CoreMsg::Inbound { inbound: crate::conn::Inbound::Request { id, .. }, .. }) => Some(id),
            _ => None,
        };
        assert_eq!(id(inbox.pop_where(is_request)), Some(2));
        assert_eq!(id(inbox.pop_where(is_request)), Some(3));
        // Client 1's request may not overtake its first message.
        assert!(inbox.pop_where(is_request).is_none());
        assert_eq!(inbox.len(), 2);
        assert!(inbox.holds_other(is_request), "client 1's first message is not a request");
        assert!(matches!(inbox.pop(), Some(CoreMsg::Disconnected { client: 1 })));
        assert!(!inbox.holds_other(is_request), "only a request left");
        assert_eq!(id(inbox.pop_where(is_request)), Some(1));
        assert!(inbox.is_empty());
        inbox.push(request(3, 4));
        inbox.push(CoreMsg::Shutdown);
        assert!(inbox.pop_where(is_request).is_none(), "shutdown waits for the core's loop");
    }

    /// A request of `client` numbered `id` (what the order checks read back).
    /// `changes` moves with every message pushed or taken, and only then:
    /// a look that found nothing leaves it, so the core may skip the scan.
    #[test]
    fn changes_count_pushes_and_takes_and_not_looks_that_find_nothing() {
        let mut inbox = FairInbox::default();
        let is_request = |m: &CoreMsg| matches!(m, CoreMsg::Inbound { .. });
        inbox.push(gone(1));
        inbox.push(request(1, 1));
        let at = inbox.changes();
        assert!(inbox.pop_where(is_request).is_none(), "client 1's request waits behind its goodbye");
        assert_eq!(inbox.changes(), at, "a look that took nothing changes nothing");
        inbox.push(request(2, 2));
        assert_ne!(inbox.changes(), at, "a push is a change");
        let at = inbox.changes();
        assert!(inbox.pop_where(is_request).is_some());
        assert_ne!(inbox.changes(), at, "a take is a change");
        let at = inbox.changes();
        assert!(inbox.pop().is_some());
        assert_ne!(inbox.changes(), at, "a pop is a change");
        let at = inbox.changes();
        inbox.push(CoreMsg::Shutdown);
        assert_ne!(inbox.changes(), at, "a shutdown is a change");
    }

    fn request(client: u64, id: u64) -> CoreMsg {
        CoreMsg::Inbound {
            client,
            inbound: crate::conn::Inbound::Request { id, request: gpumux_proto::Request::Status, fd: None },
            read_at: std::time::Instant::now(),
        }
    }

    proptest! {
        /// Messages of up to 5 clients, arriving in any interleaving: each
        /// comes out once, each client's in the order it went in, and while
        /// two clients both have messages waiting, neither is served more
        /// than one ahead of the other.
        #[test]
        fn keeps_each_clients_order_and_takes_turns(arrivals in proptest::collection::vec(0u64..5, 0..300)) {
            let mut inbox = FairInbox::default();
            for (i, c) in arrivals.iter().enumerate() {
                inbox.push(request(*c, i as u64));
            }
            let mut left = [0usize; 5];
            for c in &arrivals {
                left[*c as usize] += 1;
            }
            let mut served = [0usize; 5];
            let mut last_id = [None::<u64>; 5];
            while let Some(m) = inbox.pop() {
                let CoreMsg::Inbound { client, inbound: crate::conn::Inbound::Request { id, .. }, .. } = m else {
                    return Err(TestCaseError::fail("not a request"));
                };
                let c = client as usize;
                prop_assert!(last_id[c].is_none_or(|l| l < id), "client {} out of order", c);
                last_id[c] = Some(id);
                served[c] += 1;
                left[c] -= 1;
                for a in 0..5 {
                    for b in 0..5 {
                        if left[a] > 0 && left[b] > 0 {
                            prop_assert!(served[a] <= served[b] + 1, "client {} served {} while {} waited with {}", a, served[a], b, served[b]);
                        }
                    }
                }
            }
            prop_assert_eq!(left, [0; 5]);
            prop_assert_eq!(served.iter().sum::<usize>(), arrivals.len());
            prop_assert!(inbox.is_empty());
        }
    }
}
