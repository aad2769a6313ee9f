//! The requests a pump takes from the clients: during a poll, while its
//! answer is on its way, and between the pump's rounds. The pump itself
//! (`core/device.rs`) sends the engine's commands and polls the device.
//!
//! **Requests during a poll.** A device in another process carries out the
//! commands sent before a poll, then answers it: with 8 clients launching
//! small kernels the core waits 40-45% of its time for those answers (about
//! 8 launch commands of ~5 µs each per poll on the H100, docs/history/benchmarks.md,
//! session 15), while the clients' next launches queue in its inbox. So the core sends the
//! poll, handles the requests that need no answer from the device
//! ([`handled_during_poll`]: launches, copies, syncs, events) until the
//! answer is there, and only then takes the answer. Nothing in them reaches
//! the device before the answer but bindings, which the device process
//! takes after the poll, before any command that could use them (the
//! engine's commands go out only after the answer). The first other message
//! is held back, with everything after it, so that each client's requests
//! are handled in the order sent. Measured (runs 146-147): one client's
//! launch rate 15% higher on average, 8 clients' and the urgent latency
//! unchanged (before the device's launcher thread, run 134, it cost 8
//! clients: the device process then spent on polls what the core saved).
//!
//! The commands of requests handled during a pump's last poll (one that
//! brought no event, after a round that sent nothing) would stay in the
//! engine until the core pumped again: within a poll period if the device
//! asked to be polled again (busy), but with the device idle only at the
//! next request or timer, up to a second (`IDLE_WAIT`), while the client
//! waited for that launch (the likely cause of a second-long stall of a
//! client alone in run 184). So when the device is not busy they are sent at
//! once (run 190, docs/history/benchmarks.md), and the pump polls for them as for
//! commands sent in their turn: twice before it ends, where with one poll a
//! short kernel's end waited for the next poll period (run 191).
//!
//! **Requests between rounds.** A pump also takes the requests that
//! [`handled_during_poll`] lets through at the start of each round after the
//! first and after each launch answered from its end known ahead
//! ([`Core::take_requests`]),
//! for at most [`REQUESTS_BETWEEN_TURNS`] each time, first those the core's
//! loop had moved to its inbox (in turn, none overtaking its client's
//! earlier message). Before, a pump took requests only while a poll was out,
//! and only from the channel: a program that sent its 511 dependent launches
//! at once had them bound about 7 a device round (one exchange, ~22 µs, on
//! the H200), the rest waiting in the inbox or the channel, so the device
//! could queue natively only what was bound and the GPU's feed moved at the
//! pace of the core's rounds (issue 35: 73 rounds for the chain's 511
//! kernels, 7 requests taken in each). A bound kernel is what the device
//! needs to queue it behind its predecessor (`ClientDevice::follow`), so the
//! GPU now runs ahead of the engine as far as the device's bounds let it.
//! Nothing else is taken: another message waits for the pump's end, and
//! while one is held the pump takes no more (it ends sooner).
//!
//! Tried and removed: taking them once the round's commands are sent
//! instead (issue 35, 8 clients' launch rate: taken first, they hold back
//! the round's launch commands while a device process has only their binds
//! to carry out). In one GPU A/B (two pairs of runs on the H200) the 8
//! clients' rate followed the device process's time per launch command,
//! which varied between runs more than either order could move it. The code
//! is in git: 026a0d1 (`GPUMUX_REQUESTS_AFTER_COMMANDS=1`).

use super::*;

/// How long the core handles requests while a poll's answer is on its way
/// before it waits for the answer alone (which then spins, then sleeps:
/// `Link::recv_timeout`).
pub(super) const REQUESTS_DURING_POLL: Duration = Duration::from_micros(200);

/// How long a pump takes the clients' requests at each round and after each
/// launch answered from its end known ahead, at most (module doc, "Requests
/// between rounds"): about ten launches, so a device poll waits little.
const REQUESTS_BETWEEN_TURNS: Duration = Duration::from_micros(20);

/// A request that can be handled while a poll's answer is on its way: it
/// asks nothing of the device that needs an answer (it may bind work) and
/// cannot end the core.
fn handled_during_poll(msg: &CoreMsg) -> bool {
    use gpumux_proto::Request as R;
    match msg {
        CoreMsg::Inbound { inbound: Inbound::Request { request, .. }, .. } => matches!(
            request,
            R::Launch(_)
                | R::Memset { .. }
                | R::CopyDevice { .. }
                | R::CopyToDevice { .. }
                | R::CopyToHost { .. }
                | R::SyncStream(_)
                | R::RecordEvent(_)
                | R::QueryEvent(_)
                | R::WaitEvent(_)
        ),
        _ => false,
    }
}

impl Core {
    /// Handles requests from `inbox` until the answer to the poll just sent
    /// is there (module doc), for at most [`REQUESTS_DURING_POLL`]; returns
    /// the time spent handling them.
    pub(super) fn while_polling(&mut self, inbox: &Receiver<CoreMsg>, stats: &mut PumpStats) -> Duration {
        let start = Instant::now();
        let mut handling = Duration::ZERO;
        let mut idle_looks = 0u32;
        let mut hold_ended = false;
        while !self.backend.poll_ready() {
            if let Some(msg) = self.next_for_pump(inbox) {
                handling += self.handle_in_pump(msg, stats);
                continue;
            }
            // A clock read costs about as much as a look at the link: not every time.
            idle_looks += 1;
            if idle_looks.is_multiple_of(32) {
                // A message the pump may not handle waits for the answer:
                // the device stops holding it (`poll_hold`).
                if !hold_ended && self.inbox.holds_other(handled_during_poll) {
                    self.backend.end_hold();
                    hold_ended = true;
                }
                if start.elapsed() >= REQUESTS_DURING_POLL {
                    break;
                }
            }
            std::hint::spin_loop();
        }
        handling
    }

    /// Handles `msg` (one that [`handled_during_poll`] lets through) within a
    /// pump, counting it; returns the time it took.
    fn handle_in_pump(&mut self, msg: CoreMsg, stats: &mut PumpStats) -> Duration {
        let nested = self.calls.get().all();
        let t = Instant::now();
        let go_on = self.handle(msg);
        debug_assert!(go_on, "a request handled within a pump ended the core");
        let took = t.elapsed();
        let own = took.saturating_sub(self.calls.get().all().saturating_sub(nested));
        count_call(&self.calls, |c| &mut c.messages, own);
        stats.requests += 1;
        took
    }

    /// Takes the requests waiting that a pump may handle (module doc,
    /// "Requests between rounds"), for at most [`REQUESTS_BETWEEN_TURNS`],
    /// and only while no other message is held back (which waits for the
    /// pump's end: the pump ends sooner without more work).
    pub(super) fn take_requests(&mut self, inbox: Option<&Receiver<CoreMsg>>, stats: &mut PumpStats) {
        let Some(inbox) = inbox else { return };
        if self.inbox.holds_other(handled_during_poll) {
            return;
        }
        let start = Instant::now();
        while let Some(msg) = self.next_for_pump(inbox) {
            self.handle_in_pump(msg, stats);
            stats.requests_between += 1;
            if start.elapsed() >= REQUESTS_BETWEEN_TURNS {
                return;
            }
        }
    }

    /// The next message a pump may handle ([`handled_during_poll`]): those
    /// waiting in the inbox first (the core's loop moved them there; left
    /// there, a program's launches waited for the pump's end), else the
    /// channel's next, unless its client has messages waiting in the inbox
    /// (it may not overtake them). One the pump may not handle goes to the
    /// inbox, and `None` is returned, as when nothing waits.
    fn next_for_pump(&mut self, inbox: &Receiver<CoreMsg>) -> Option<CoreMsg> {
        // Its scan looks up every waiting client's first message; while a
        // poll is out the pump looks again and again, with nothing new.
        if self.pump_missed_inbox_at != Some(self.inbox.changes()) {
            if let Some(msg) = self.inbox.pop_where(handled_during_poll) {
                return Some(msg);
            }
            self.pump_missed_inbox_at = Some(self.inbox.changes());
        }
        match inbox.try_recv() {
            Ok(msg) if handled_during_poll(&msg) && !self.inbox.holds_for(&msg) => Some(msg),
            Ok(msg) => {
                self.inbox.push(msg);
                None
            }
            Err(_) => None,
        }
    }
}
