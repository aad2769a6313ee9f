//! The core's side of the device: engine commands out, device events in,
//! completions back to the clients, and the stage log of every kernel.
//!
//! The clients' requests a pump takes meanwhile, during its polls and
//! between its rounds, are `core/pump_requests.rs`'s.

use super::*;
use gpumux_engine::device::ReleaseCause;
use gpumux_engine::ids::SmId;
use std::collections::hash_map::Entry;

impl Core {
    /// Exchanges commands, events and completions with the engine and the
    /// device until nothing is left to do at this instant.
    pub fn pump(&mut self) -> Result<PumpStats, CoreError> {
        self.pump_with(None)
    }

    /// [`Core::pump`], handling requests from `inbox` while each poll's
    /// answer is on its way (`pump_requests`) if the device is in another process.
    pub(super) fn pump_with(&mut self, inbox: Option<&Receiver<CoreMsg>>) -> Result<PumpStats, CoreError> {
        let mut stats = PumpStats::default();
        if let Some(at) = self.engine.poll_timeout() {
            let now = self.backend.now();
            if at <= now {
                let t = Instant::now();
                self.engine.handle_timeout(now);
                count_call(&self.calls, |c| &mut c.engine, t.elapsed());
            }
        }
        // Commands sent at the end of a round (below) count as the next
        // round's: like any round that sends, it polls again after an empty
        // answer, which catches a short kernel's end a poll period sooner.
        let mut sent_late = false;
        for _ in 0..MAX_ROUNDS {
            stats.rounds += 1;
            self.drain_completions_timed(&mut stats);
            // The clients' requests waiting: bound, their kernels may be
            // queued on the GPU while the engine trails (`pump_requests`,
            // "Requests between rounds"), before the round's commands. Not
            // in the first round: the core's loop has just taken its own.
            if stats.rounds > 1 {
                self.take_requests(inbox, &mut stats);
            }
            let requests_before = stats.requests;
            let sent = self.drain_commands(&mut stats, inbox)? | std::mem::take(&mut sent_late);
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            let call = Instant::now();
            let mut handling = Duration::ZERO;
            if let Some(inbox) = inbox {
                // Held while the device is busy (`poll_hold`): its answer
                // comes when the device has news, not a poll period later.
                if self.backend.start_held_poll(self.poll_hold()) {
                    handling = self.while_polling(inbox, &mut stats);
                }
            }
            let requests_during_poll = stats.requests > requests_before;
            let polled = self.backend.poll(&mut events);
            let took = call.elapsed().saturating_sub(handling);
            stats.slowest_call = stats.slowest_call.max(took);
            stats.poll_calls += took;
            count_call(&self.calls, |c| &mut c.polls, took);
            stats.events += events.len() as u32;
            let t = match polled {
                Ok(t) => t,
                Err(f) => {
                    self.events = events;
                    self.failure(f)?;
                    continue;
                }
            };
            self.take_failed_ops();
            self.take_loaded();
            self.take_registered();
            self.take_moved();
            if events.is_empty() && !sent {
                self.events = events;
                // Requests handled while this poll was out (a launch on an idle
                // device among them) may have left commands in the engine. Sent
                // now, the next round's poll settles them; left there, they
                // waited for the next request or timer, up to a second with the
                // device idle (`IDLE_WAIT`; `pump_requests`). A device that asked to
                // be polled again (busy) takes them at that poll, with whatever
                // else came meanwhile (8 clients launched fewer per second when
                // every such round polled again, run 190).
                let polled_again = matches!(self.backend.next_wake(), Wake::Spin);
                if requests_during_poll && !polled_again && self.drain_commands(&mut stats, inbox)? {
                    sent_late = true;
                    continue;
                }
                break;
            }
            self.engine_on_events(t, &mut events, &mut stats)?;
            self.events = events;
        }
        self.drain_completions_timed(&mut stats);
        if stats.events + stats.commands + stats.requests > 0 {
            let r = &mut self.round_clock.total;
            r.pumps += 1;
            r.rounds += u64::from(stats.rounds);
            r.events += u64::from(stats.events);
            r.events_engine += stats.events_engine;
            r.commands += u64::from(stats.commands);
            r.commands_engine += stats.commands_engine;
            r.completions += stats.completions;
            r.answered_in_turn += u64::from(stats.answered_in_turn);
            r.requests_between += u64::from(stats.requests_between);
        }
        // Clients idle now may make room for a restore that waits.
        self.try_restores();
        if !stats.retreat_calls.is_zero() {
            // Where a preemption's turn went (an urgent kernel's `decide`: docs/daemon.md).
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            tracing::debug!(
                "a turn with a retreat: engine {:.1} µs, retreat calls {:.1} µs, launch calls {:.1} µs, \
                 polls {:.1} µs ({} events), {} rounds",
                us(stats.engine),
                us(stats.retreat_calls),
                us(stats.launch_calls),
                us(stats.poll_calls),
                stats.events,
                stats.rounds
            );
        }
        Ok(stats)
    }

    /// Sends the engine's commands to the device; true if any went.
    /// Between launches answered from ends known ahead it takes the clients'
    /// requests ([`Core::take_requests`]): such a chain of turns goes on
    /// without a poll, and requests were handled only during polls.
    fn drain_commands(&mut self, stats: &mut PumpStats, inbox: Option<&Receiver<CoreMsg>>) -> Result<bool, CoreError> {
        let mut sent = false;
        // An engine that owes no command and has nothing new to schedule
        // gives none at once, with no work to time: no clock read for that
        // poll, nor for the whole call when it is the first (most rounds'
        // calls, and every call's last poll after its last command; issue
        // 35's callgrind of 8 clients).
        if !self.engine.has_commands_due() {
            return Ok(false);
        }
        // One clock read ends a part and starts the next (the engine's turn,
        // then the command's tracking and send): a read per part, not two
        // (issue 35's callgrind: clock reads were a tenth of a chain's
        // instructions per kernel).
        let mut mark = Instant::now();
        while self.engine.has_commands_due() {
            let next = self.engine.poll_command()?;
            let engine_done = Instant::now();
            let took = engine_done.saturating_duration_since(mark);
            mark = engine_done;
            stats.engine += took;
            stats.commands_engine += took;
            count_call(&self.calls, |c| &mut c.engine, took);
            let Some(cmd) = next else { break };
            sent = true;
            if let Command::Copy { copy, op, .. } = cmd {
                if !self.ops.contains_key(&op) {
                    // The engine starts a copy when it reaches its stream's
                    // head, queuing the command; a client gone before the
                    // command got here had the copy dropped and its work
                    // unbound. It moves no bytes; the engine has its end.
                    self.engine.handle_event(self.backend.now(), Event::CopyDone { copy })?;
                    continue;
                }
            }
            self.track_command(&cmd, engine_done);
            stats.commands += 1;
            let launched_op = if let Command::Launch { op, .. } = &cmd { Some(*op) } else { None };
            let retreat = matches!(cmd, Command::Retreat { .. });
            // A launch's command and, if it was answered from its end known
            // ahead, its operation's unbind go to a device process as one
            // write. Not the binds of the requests taken after it: held for
            // up to `REQUESTS_BETWEEN_TURNS`, they would reach the device
            // that much later, and a bound kernel is what the device queues
            // behind the one before (the GPU's lead over the engine).
            if launched_op.is_some() {
                self.backend.hold_sends();
            }
            let submitted = self.backend.submit(cmd);
            let send_done = Instant::now();
            let took = send_done.saturating_duration_since(mark);
            mark = send_done;
            stats.slowest_call = stats.slowest_call.max(took);
            count_call(&self.calls, |c| &mut c.sends, took);
            if retreat {
                stats.retreat_calls += took;
            } else if launched_op.is_some() {
                stats.launch_calls += took;
            }
            // The launch's stamp is also when the engine reads its end if the
            // backend answered it (one read of the clock for the send's time,
            // the stamp and the end).
            let launched_at = launched_op.map(|_| self.backend.now_at(send_done));
            if let Some((e, at)) = launched_op.and_then(|op| self.ops.get_mut(&op)).zip(launched_at) {
                e.stamps.launched.get_or_insert(at);
            }
            if let Err(f) = submitted {
                self.backend.release_sends();
                self.failure(f)?;
                return Ok(true);
            }
            if let Some(at) = launched_at {
                let answered = self.take_answered(stats, at);
                self.backend.release_sends();
                if answered? {
                    self.take_requests(inbox, stats);
                    mark = Instant::now();
                }
            }
        }
        Ok(sent)
    }

    /// A launch command just sent may have been answered by the backend
    /// from its kernel's end, known ahead (`backend::ends_ahead`): the
    /// engine reads that end now and the operation completes, so that the
    /// next command the engine gives (the next kernel of the chain, whose end
    /// may be known too) goes out in this same turn. A chain of kernels the
    /// device ran ahead then costs the core one engine turn per kernel and
    /// no device round at all: before, each such end waited for a round of
    /// its own (its poll answered without the device), and the core's rounds
    /// paced the chain (issue 35, one round per kernel of ~14 µs on the H200).
    fn take_answered(&mut self, stats: &mut PumpStats, now: Nanos) -> Result<bool, CoreError> {
        let mut answered = std::mem::take(&mut self.events);
        answered.clear();
        if !self.backend.take_answered(&mut answered) {
            self.events = answered;
            return Ok(false);
        }
        stats.answered_in_turn += 1;
        stats.events += answered.len() as u32;
        self.engine_on_events(now, &mut answered, stats)?;
        self.events = answered;
        // Its operation completes (an unbind, the stream's next), as at the start of a round.
        self.drain_completions_timed(stats);
        Ok(true)
    }

    /// [`Core::drain_completions`], its time counted in `stats` when the
    /// engine has completions to give: many drains of a pump find none, and
    /// their two clock reads for nothing were ~0.9 of a launch's ~17 (issue
    /// 35's callgrind of 8 clients).
    fn drain_completions_timed(&mut self, stats: &mut PumpStats) {
        if !self.engine.has_completions() {
            self.drain_completions();
            return;
        }
        let t = Instant::now();
        self.drain_completions_from(Some(t));
        stats.completions += t.elapsed();
    }

    /// Hands `events` (drained) to the engine at `now`, each tracked first,
    /// and counts the engine's time: a round's events and the ends answered
    /// in the turn that made their launch go the same way.
    fn engine_on_events(
        &mut self,
        now: Nanos,
        events: &mut Vec<Event>,
        stats: &mut PumpStats,
    ) -> Result<(), CoreError> {
        let engine = Instant::now();
        // A launch's SMs released one after the other (one event per SM the
        // device reports) go to the engine as one release: one lookup of the
        // launch and its kernel instead of one per SM (issue 35). Only a run
        // in increasing SM order is merged, so that the engine sees exactly
        // what the events one by one would have shown it.
        let mut run: Option<(LaunchId, ReleaseCause, SmId, SmSet)> = None;
        for e in events.drain(..) {
            if let Event::SmReleased { launch, sm, cause } = e {
                self.track_event(&e, now);
                match &mut run {
                    Some((l, c, last, set)) if *l == launch && *c == cause && sm > *last => {
                        set.insert(sm);
                        *last = sm;
                    }
                    _ => {
                        if let Some((l, c, _, set)) = run.take() {
                            self.engine.handle_released(now, l, set, c)?;
                        }
                        run = Some((launch, cause, sm, SmSet::single(sm)));
                    }
                }
                continue;
            }
            if let Some((l, c, _, set)) = run.take() {
                self.engine.handle_released(now, l, set, c)?;
            }
            self.track_event(&e, now);
            self.engine.handle_event(now, e)?;
        }
        if let Some((l, c, _, set)) = run.take() {
            self.engine.handle_released(now, l, set, c)?;
        }
        let took = engine.elapsed();
        stats.engine += took;
        stats.events_engine += took;
        count_call(&self.calls, |c| &mut c.engine, took);
        Ok(())
    }

    /// Tracks `cmd`, which the engine gave at `at` (the clock read that
    /// ended the engine's part: `drain_commands`).
    fn track_command(&mut self, cmd: &Command, at: Instant) {
        match cmd {
            Command::Launch { launch, op, sms, .. } => {
                self.launches.insert(*launch, (*op, *sms));
                let now = self.backend.now_at(at);
                // Counted once (a count of the set's words).
                let n = sms.len();
                self.record.started(*op, n, now);
                if let Some(e) = self.ops.get_mut(op) {
                    e.launches += 1;
                    e.launched += 1;
                    e.first_launch.get_or_insert((now, n));
                    if e.stamps.commanded.is_none() {
                        e.stamps.commanded = Some(now);
                        // Its stream's operation before it (if it waited for one) completed then.
                        let last_done = self
                            .sessions
                            .get(&e.client)
                            .and_then(|s| s.streams.get(&e.stream))
                            .map_or(0, |st| st.last_done);
                        e.stamps.ready = Some(last_done.max(e.stamps.queued));
                    }
                }
            }
            Command::Grow { launch, sms } => {
                if let Some((_, held)) = self.launches.get_mut(launch) {
                    *held = held.union(sms);
                }
            }
            Command::Retreat { launch, .. } => {
                let client = self.launches.get(launch).and_then(|(op, _)| self.ops.get(op)).map(|e| e.client);
                if let Some(s) = client.and_then(|c| self.sessions.get_mut(&c)) {
                    s.counters.preemptions += 1;
                }
            }
            Command::Copy { copy, op, .. } => {
                self.copies.insert(*copy, *op);
                self.record.started(*op, 0, self.backend.now_at(at));
                if let Some(e) = self.ops.get_mut(op) {
                    e.copying = true;
                }
            }
        }
    }

    /// Tracks `event`, which the engine hears of at `now` (the device's
    /// clock read for the whole batch, not once per launch's end).
    fn track_event(&mut self, event: &Event, now: Nanos) {
        match event {
            Event::SmReleased { launch, sm, .. } => {
                if let Some((_, held)) = self.launches.get_mut(launch) {
                    held.remove(*sm);
                }
            }
            Event::LaunchEnded { launch, .. } => {
                if let Some((op, _)) = self.launches.remove(launch) {
                    if let Some(e) = self.ops.get_mut(&op) {
                        e.launches = e.launches.saturating_sub(1);
                        e.stamps.ended = Some(now);
                    }
                    self.maybe_finish(op);
                }
            }
            Event::CopyDone { copy } => {
                if let Some(op) = self.copies.remove(copy) {
                    if let Some(e) = self.ops.get_mut(&op) {
                        e.copying = false;
                    }
                    self.maybe_finish(op);
                }
            }
        }
    }

    /// Notes the operations the device ended without doing their work
    /// (`Backend::take_failed`), before the engine completes them: their
    /// completion makes the error sticky on their stream (`drain_completions`).
    fn take_failed_ops(&mut self) {
        let mut failed = std::mem::take(&mut self.failed_scratch);
        self.backend.take_failed(&mut failed);
        for f in failed.drain(..) {
            match self.ops.get_mut(&f.op) {
                Some(e) => {
                    let name = self.sessions.get(&e.client).map_or("?", |s| s.name.as_str());
                    tracing::warn!("client {} ({name}): {} failed on the device: {}", e.client, f.op, f.why);
                    e.failed = Some(f.why);
                }
                None => tracing::warn!("{} failed on the device after its client left: {}", f.op, f.why),
            }
        }
        self.failed_scratch = failed;
    }

    /// Answers the pins that finished (`Backend::take_registered`).
    fn take_registered(&mut self) {
        let mut done: Vec<Registered> = Vec::new();
        self.backend.take_registered(&mut done);
        for r in done {
            self.region_pinned(r.token, r.result);
        }
    }

    /// Answers the module loads that finished (`Backend::take_loaded`).
    fn take_loaded(&mut self) {
        let mut loaded: Vec<Loaded> = Vec::new();
        self.backend.take_loaded(&mut loaded);
        for l in loaded {
            self.module_loaded(l.token, l.result);
        }
    }

    /// Turns the engine's completions into replies.
    pub(super) fn drain_completions(&mut self) {
        self.drain_completions_from(None);
    }

    /// [`Core::drain_completions`], `read` a clock read just made (the one
    /// that starts the drain's timing), if any.
    fn drain_completions_from(&mut self, mut read: Option<Instant>) {
        while let Some(c) = self.engine.poll_completion() {
            // One clock time per completion, for its record, its stages and
            // its stream (three reads before: issue 35's callgrind): the read
            // just made, if one was (the drain's start; the end of the last
            // completion's unbind, a few hundred instructions ago), else a
            // read now. Two reads a completion then, its unbind's, not three.
            let now = self.backend.now_at(read.take().unwrap_or_else(Instant::now));
            self.record.completed(c.op, c.outcome == OpOutcome::Completed, now);
            let Some(e) = self.ops.get_mut(&c.op) else { continue };
            e.ended = true;
            let (client, stream) = (e.client, e.stream);
            // A split's operations are handled after the drain (core/split.rs).
            match &e.kind {
                OpKind::SplitReached { token } => self
                    .split
                    .todo
                    .push(super::split::Step::Reached { token: *token, completed: c.outcome == OpOutcome::Completed }),
                OpKind::SplitRange { token } => self.split.todo.push(super::split::Step::RangeEnded {
                    client,
                    token: *token,
                    completed: c.outcome == OpOutcome::Completed,
                    failed: e.failed.clone(),
                }),
                _ => {}
            }
            if let Some(why) = e.failed.take() {
                let what = match &e.kind {
                    OpKind::Kernel { desc } => format!("kernel `{}` ({}) did not run: {why}", desc.name, c.op),
                    _ => format!("{} did not run: {why}", c.op),
                };
                if let Some(st) = self.sessions.get_mut(&client).and_then(|s| s.streams.get_mut(&stream)) {
                    // The first error stays: it is the one that explains the rest.
                    st.error.get_or_insert_with(|| ErrorReply::new(ErrorKind::Device, what));
                }
            }
            let completed = c.outcome == OpOutcome::Completed;
            // What to do, decided while `e` is borrowed, done after.
            let (kernel_done, reply, event) = match &e.kind {
                OpKind::Kernel { .. } => (completed, None, None),
                OpKind::Copy { reply } => (false, reply.filter(|_| completed), None),
                OpKind::Sync { reply } => (false, Some(*reply).filter(|_| completed), None),
                OpKind::Event(ev) => (false, None, Some(*ev).filter(|_| completed)),
                OpKind::Wait | OpKind::Hold | OpKind::Gate => (false, None, None),
                OpKind::SplitReached { .. } | OpKind::SplitHold | OpKind::SplitRange { .. } => (false, None, None),
                // Answered below, with the hold's token (`host_func_reached`).
                OpKind::HostFunc { .. } => (false, None, None),
            };
            let host_func = match &e.kind {
                OpKind::HostFunc { reply, hold: Some(hold) } if completed => Some((*reply, *hold)),
                _ => None,
            };
            if kernel_done || reply.is_some() {
                if let Some(s) = self.sessions.get_mut(&client) {
                    if kernel_done {
                        s.counters.kernels_done += 1;
                        s.stages.kernel(&e.stamps, now);
                    } else if matches!(e.kind, OpKind::Sync { .. }) {
                        s.stages.sync(e.queued, now);
                    }
                }
            }
            // A failure before it on its stream is what this reply says
            // (sticky; a sync reports it and clears it).
            let is_sync = reply.is_some() && matches!(e.kind, OpKind::Sync { .. });
            let sticky = if reply.is_some() || event.is_some() {
                self.sessions.get_mut(&client).and_then(|s| s.streams.get_mut(&stream)).and_then(|st| {
                    if is_sync {
                        st.error.take()
                    } else {
                        st.error.clone()
                    }
                })
            } else {
                None
            };
            let done = || sticky.clone().map_or(Ok(Reply::Done), Err);
            if let Some(id) = reply {
                self.reply(client, id, done());
            }
            if let Some(ev) = event {
                let waiters = self
                    .sessions
                    .get_mut(&client)
                    .and_then(|s| s.events.get_mut(&ev))
                    .map(|st| {
                        st.op = None;
                        st.ended_at = Some(self.engine.now());
                        std::mem::take(&mut st.waiters)
                    })
                    .unwrap_or_default();
                for w in waiters {
                    self.reply(client, w, done());
                }
            }
            if let Some((reply, hold)) = host_func {
                self.host_func_reached(client, stream, reply, hold);
            }
            // A stream closing goes once idle (`close_stream_if_idle`), looked up once for both.
            let closed = match self.sessions.get_mut(&client).and_then(|s| s.streams.get_mut(&stream)) {
                Some(st) => {
                    st.pending = st.pending.saturating_sub(1);
                    st.last_done = now;
                    st.closing && st.pending == 0
                }
                None => false,
            };
            if closed {
                self.close_stream_if_idle(client, stream);
            }
            read = self.maybe_finish(c.op);
        }
        if !self.split.todo.is_empty() {
            self.split_steps();
        }
    }

    /// Forgets an operation that the engine ended and the device let go of;
    /// if it did, the clock read that ended its unbind's timing (none if a
    /// gone client's reap, with its frees and its log, came after).
    fn maybe_finish(&mut self, op: OpId) -> Option<Instant> {
        // One lookup for the look and the removal.
        let Entry::Occupied(entry) = self.ops.entry(op) else { return None };
        let e = entry.get();
        if !e.ended || e.launches > 0 || e.copying {
            return None;
        }
        let e = entry.remove();
        self.log_if_slow_urgent(op, &e);
        let client = e.client;
        let t = Instant::now();
        self.backend.unbind(op);
        let unbound = Instant::now();
        count_call(&self.calls, |c| &mut c.sends, unbound.saturating_duration_since(t));
        // A gone client is reaped with its last operation (`reap`), looked up once for both.
        let reap = self.sessions.get_mut(&client).is_some_and(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.phase == Phase::Gone && s.in_flight == 0
        });
        self.release_ready();
        if reap {
            self.reap(client);
            return None;
        }
        Some(unbound)
    }

    /// Logs an urgent kernel that took longer than [`SLOW_URGENT`] (see there).
    fn log_if_slow_urgent(&self, op: OpId, e: &OpEntry) {
        if e.priority <= 0 || !matches!(e.kind, OpKind::Kernel { .. }) {
            return;
        }
        let now = self.backend.now();
        let total = now.saturating_sub(e.queued);
        if total <= SLOW_URGENT {
            return;
        }
        let us = |ns: Nanos| ns as f64 / 1e3;
        let name = self.sessions.get(&e.client).map_or("?", |s| s.name.as_str());
        match e.first_launch {
            Some((at, sms)) => tracing::info!(
                "slow urgent kernel: client {} ({name}) {op} at priority {}: {:.0} µs from request to end: \
                 {:.0} µs before its first launch (on {sms} SMs), {:.0} µs from there to its end, {} launch(es); \
                 device launches in flight now: {}",
                e.client,
                e.priority,
                us(total),
                us(at.saturating_sub(e.queued)),
                us(now.saturating_sub(at)),
                e.launched,
                self.launches.len()
            ),
            None => tracing::info!(
                "slow urgent kernel: client {} ({name}) {op} at priority {}: {:.0} µs, never launched",
                e.client,
                e.priority,
                us(total)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ends_ahead::{EndAhead, KnownEnds};
    use crate::backend::sim::SimBackend;
    use crate::backend::{ModuleImage, Wake};
    use gpumux_proto::Launch;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The `Backend` methods a test backend leaves to its simulator
    /// (`self.sim`): those no test backend changes, and the ones named
    /// (`delegate_to_sim!(unbind, next_wake)`) that this one does not.
    macro_rules! delegate_to_sim {
        (@ start_load) => {
            fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]) {
                self.sim.start_load(token, name, source, options)
            }
        };
        (@ unbind) => {
            fn unbind(&mut self, op: OpId) {
                self.sim.unbind(op)
            }
        };
        (@ take_failed) => {
            fn take_failed(&mut self, out: &mut Vec<crate::backend::OpFailed>) {
                self.sim.take_failed(out)
            }
        };
        (@ next_wake) => {
            fn next_wake(&self) -> Wake {
                self.sim.next_wake()
            }
        };
        ($($also:ident),*) => {
            $(delegate_to_sim!(@ $also);)*
            fn describe(&self) -> String {
                self.sim.describe()
            }
            fn info(&self) -> &gpumux_engine::kernel::DeviceInfo {
                self.sim.info()
            }
            fn mem_info(&mut self) -> Result<MemInfo, MemError> {
                self.sim.mem_info()
            }
            fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
                self.sim.alloc(bytes)
            }
            fn free(&mut self, addr: DevAddr) -> Result<(), MemError> {
                self.sim.free(addr)
            }
            fn register_host(&mut self, region: &Arc<ShmRegion>) -> Result<(), MemError> {
                self.sim.register_host(region)
            }
            fn unregister_host(&mut self, region: &ShmRegion) {
                self.sim.unregister_host(region)
            }
            fn start_register(&mut self, token: u64, region: &Arc<ShmRegion>) {
                self.sim.start_register(token, region)
            }
            fn take_registered(&mut self, out: &mut Vec<Registered>) {
                self.sim.take_registered(out)
            }
            fn load_module(&mut self, name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError> {
                self.sim.load_module(name, source, options)
            }
            fn take_loaded(&mut self, out: &mut Vec<Loaded>) {
                self.sim.take_loaded(out)
            }
            fn unload_module(&mut self, kernels: &[crate::backend::KernelCode]) {
                self.sim.unload_module(kernels)
            }
            fn kernels_loaded(&self) -> usize {
                self.sim.kernels_loaded()
            }
            fn now(&self) -> Nanos {
                self.sim.now()
            }
            fn now_at(&self, at: Instant) -> Nanos {
                self.sim.now_at(at)
            }
            fn rebuild(&mut self) -> Result<(), MemError> {
                self.sim.rebuild()
            }
        };
    }

    /// The simulator behind a link that answers polls late, as a device
    /// process does: the core handles requests while the poll is out. Counts
    /// the commands that reach the device and the polls, and keeps the
    /// kernel each bound kernel follows; its polls report nothing (a device
    /// whose work takes long).
    struct PollsLate {
        sim: SimBackend,
        /// Loads started after this is set never finish (a compile that takes forever).
        hold_loads: Arc<std::sync::atomic::AtomicBool>,
        looks: u32,
        commands: Arc<AtomicUsize>,
        polls: Arc<AtomicUsize>,
        follows: Arc<std::sync::Mutex<Vec<Follows>>>,
    }

    /// A bound kernel operation and the kernel it follows on its stream.
    type Follows = (OpId, Option<OpId>);

    impl PollsLate {
        fn new() -> PollsLate {
            PollsLate {
                sim: SimBackend::with_info(gpumux_sim::presets::h100()),
                hold_loads: Arc::default(),
                looks: 0,
                commands: Arc::default(),
                polls: Arc::default(),
                follows: Arc::default(),
            }
        }
    }

    /// A core on `backend` with one client (id 1) greeted and a module of
    /// one kernel loaded; the kernel's handle and the client's replies.
    fn core_with_kernel(backend: PollsLate) -> (Core, KernelId, std::sync::mpsc::Receiver<ServerFrame>) {
        core_with_kernel_on(Box::new(backend))
    }

    /// [`core_with_kernel`] on any backend.
    fn core_with_kernel_on(backend: Box<dyn Backend>) -> (Core, KernelId, std::sync::mpsc::Receiver<ServerFrame>) {
        let mut core = Core::new(backend, None).expect("a core on sim:h100");
        let (kernel, replies) = connect_with_kernel(&mut core, 1);
        (core, kernel, replies)
    }

    /// Client `client` connected to `core`, greeted, with a module of one
    /// kernel loaded; the kernel's handle and the client's replies.
    fn connect_with_kernel(core: &mut Core, client: u64) -> (KernelId, std::sync::mpsc::Receiver<ServerFrame>) {
        let (tx, replies) = std::sync::mpsc::channel();
        core.connect(client, Peer { pid: client as i32, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
        assert!(core.handle(request_of(client, 1, Request::hello("t", 0))));
        let module =
            Request::LoadModule { name: "m.cu".into(), source: "__global__ void j() {}\n".into(), options: Vec::new() };
        assert!(core.handle(request_of(client, 2, module)));
        // Loads are answered from the device's loads (`Backend::take_loaded`), in a pump.
        let kernel = match answer_to(core, &replies, 2) {
            Ok(Reply::Module { kernels, .. }) => kernels[0].kernel,
            other => panic!("client {client}'s module did not load: {other:?}"),
        };
        (kernel, replies)
    }

    /// Request `id` of client 1.
    fn request(id: u64, request: Request) -> CoreMsg {
        request_of(1, id, request)
    }

    /// Request `id` of client `client`, read from its socket now.
    fn request_of(client: u64, id: u64, request: Request) -> CoreMsg {
        CoreMsg::Inbound { client, inbound: Inbound::Request { id, request, fd: None }, read_at: Instant::now() }
    }

    /// Fails the test if any reply in `replies` is a refusal.
    fn assert_none_refused(replies: &std::sync::mpsc::Receiver<ServerFrame>) {
        if let Some(e) = replies.try_iter().find_map(|f| match f {
            ServerFrame::Reply { result: Err(e), .. } => Some(e),
            _ => None,
        }) {
            panic!("a request was refused: {e:?}");
        }
    }

    fn launch_of(kernel: KernelId) -> Request {
        Request::Launch(launch_of_struct(kernel))
    }

    fn launch_of_struct(kernel: KernelId) -> Launch {
        Launch {
            kernel,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
            args: Vec::new(),
            stream: StreamId(0),
            block_time_ns: Some(1_000),
        }
    }

    impl Backend for PollsLate {
        delegate_to_sim!(unbind, take_failed, next_wake);
        fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]) {
            if !self.hold_loads.load(Ordering::Relaxed) {
                self.sim.start_load(token, name, source, options)
            }
        }
        fn bind(&mut self, op: OpId, work: OpWork) {
            if let OpWork::Kernel { after, .. } = &work {
                self.follows.lock().expect("not poisoned").push((op, *after));
            }
            self.sim.bind(op, work)
        }
        fn submit(&mut self, command: Command) -> Result<(), Failure> {
            self.commands.fetch_add(1, Ordering::Relaxed);
            self.sim.submit(command)
        }
        fn poll(&mut self, _events: &mut Vec<Event>) -> Result<Nanos, Failure> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            Ok(self.sim.now())
        }
        fn start_poll(&mut self) -> bool {
            self.looks = 0;
            true
        }
        fn poll_ready(&mut self) -> bool {
            // Not on the first look: the core takes a request from its inbox first.
            self.looks += 1;
            self.looks > 1
        }
    }

    /// A launch that reaches the core while the last poll of a pump is out,
    /// on an idle device, goes to the device in that pump: left in the
    /// engine, it waited for the client's next request or a timer, up to a
    /// second (`IDLE_WAIT`), while its client waited for it. And the pump
    /// polls for it as for commands sent in their turn: twice before it ends
    /// (with one poll, a short kernel's end waited a poll period longer: the
    /// launch + sync p50 of run 191).
    #[test]
    fn a_launch_handled_while_a_pumps_last_poll_is_out_reaches_the_device_in_that_pump() {
        let backend = PollsLate::new();
        let (commands, polls) = (backend.commands.clone(), backend.polls.clone());
        let (mut core, kernel, _replies) = core_with_kernel(backend);
        core.pump().expect("pump");
        let before = commands.load(Ordering::Relaxed);
        // The pump's only poll goes out with nothing to send; the launch comes meanwhile.
        let (inbox_tx, inbox) = std::sync::mpsc::channel();
        inbox_tx.send(request(3, launch_of(kernel))).expect("queued");
        let polls_before = polls.load(Ordering::Relaxed);
        let stats = core.pump_with(Some(&inbox)).expect("pump");
        assert_eq!(stats.requests, 1, "the launch was handled while the poll was out");
        assert!(
            commands.load(Ordering::Relaxed) > before,
            "the launch's command reached the device in the pump that handled it"
        );
        assert_eq!(
            polls.load(Ordering::Relaxed) - polls_before,
            3,
            "the poll that brought the launch, then two for its command, as after any round that sends"
        );
    }

    /// A launch handled while the device is idle leaves the engine owing it
    /// commands: the core must come back within a poll period, not sleep
    /// until the device's next news (up to `IDLE_WAIT`). A pump cut short
    /// by a time budget once left commands there with the device idle, and
    /// a chain of launches moved one round a second on the H200 (5e2817f).
    #[test]
    fn commands_the_engine_owes_an_idle_device_bring_the_core_back_at_once() {
        let (mut core, kernel, _replies) =
            core_with_kernel_on(Box::new(SimBackend::with_info(gpumux_sim::presets::h100())));
        // Idle now: everything the module's load made is done.
        while core.device_due(Instant::now()) {
            core.pump_with(None).expect("a pump");
        }
        assert!(core.wait() > core.poll_every, "idle, nothing owed: the core may sleep");
        assert!(core.handle(request(3, launch_of(kernel))));
        assert!(core.engine.has_commands_due(), "the launch is the engine's to place");
        assert!(core.device_due(Instant::now()), "owed commands make the device due");
        assert!(core.wait() <= core.poll_every, "and the core's wait at most a poll period");
        core.pump_with(None).expect("a pump");
        assert!(!core.engine.has_commands_due(), "the pump sent them");
    }

    /// A kernel is bound as following the kernel before it on its stream
    /// past recorded events and syncs, which order nothing on the GPU (so the
    /// CUDA device may queue it behind that kernel), but not past a memset,
    /// which it must wait for.
    #[test]
    fn a_kernel_follows_the_one_before_past_events_and_syncs_but_not_past_a_memset() {
        let backend = PollsLate::new();
        let follows = backend.follows.clone();
        let (mut core, kernel, replies) = core_with_kernel(backend);
        assert!(core.handle(request(3, Request::Alloc { bytes: 4096 })));
        let buffer = replies
            .try_iter()
            .find_map(|f| match f {
                ServerFrame::Reply { id: 3, result: Ok(Reply::Buffer(b)) } => Some(b),
                _ => None,
            })
            .expect("the buffer allocated");
        let memset = Request::Memset {
            dst: gpumux_proto::BufferSlice { buffer, offset: 0 },
            value: 0,
            bytes: 4096,
            stream: StreamId(0),
        };
        let requests = [
            launch_of(kernel),
            Request::RecordEvent(StreamId(0)),
            launch_of(kernel),
            Request::SyncStream(StreamId(0)),
            launch_of(kernel),
            memset,
            launch_of(kernel),
        ];
        for (i, r) in requests.into_iter().enumerate() {
            assert!(core.handle(request(10 + i as u64, r)));
        }
        let bound = follows.lock().expect("not poisoned").clone();
        let ops: Vec<OpId> = bound.iter().map(|(op, _)| *op).collect();
        let after: Vec<Option<OpId>> = bound.iter().map(|(_, a)| *a).collect();
        assert_eq!(ops.len(), 4, "four kernels bound: {bound:?}");
        assert_eq!(
            after,
            vec![None, Some(ops[0]), Some(ops[1]), None],
            "past an event and a sync each kernel follows the one before; past the memset none"
        );
        assert_none_refused(&replies);
    }

    /// The simulator behind a device that reports every one-block kernel
    /// bound to follow another as ended ahead at its next poll (as the CUDA device's
    /// deep queue ahead does behind a native launch), and answers the
    /// engine's launches of those itself, as `RemoteBackend` does
    /// (`backend::ends_ahead`): at the next poll, without asking the device,
    /// which never runs them. Counts the launches answered, the polls
    /// answered without the device, and the launches the device ran.
    struct AnswersAhead {
        sim: SimBackend,
        known: KnownEnds,
        /// Kernels bound to follow another, reported at the next device poll.
        bound_after: Vec<EndAhead>,
        /// Operations whose launch went to the device.
        launched: HashSet<OpId>,
        answered: Arc<AtomicUsize>,
        local_polls: Arc<AtomicUsize>,
        device_launches: Arc<AtomicUsize>,
        known_left: Arc<AtomicUsize>,
    }

    impl AnswersAhead {
        fn new() -> AnswersAhead {
            AnswersAhead {
                sim: SimBackend::with_info(gpumux_sim::presets::h100()),
                known: KnownEnds::default(),
                bound_after: Vec::new(),
                launched: HashSet::new(),
                answered: Arc::default(),
                local_polls: Arc::default(),
                device_launches: Arc::default(),
                known_left: Arc::default(),
            }
        }
    }

    impl Backend for AnswersAhead {
        delegate_to_sim!(start_load);
        fn bind(&mut self, op: OpId, work: OpWork) {
            // One-block kernels only: a larger one stands for a kernel that runs long.
            if let OpWork::Kernel { after: Some(_), grid: [1, 1, 1], .. } = &work {
                self.bound_after.push(EndAhead { op, blocks: 1 });
            }
            self.sim.bind(op, work)
        }
        fn unbind(&mut self, op: OpId) {
            self.known.forget(op);
            self.bound_after.retain(|e| e.op != op);
            self.known_left.store(self.known.known(), Ordering::Relaxed);
            self.sim.unbind(op)
        }
        fn submit(&mut self, command: Command) -> Result<(), Failure> {
            if self.known.drops(&command) {
                return Ok(());
            }
            if self.known.answer(&command) {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            if let Command::Launch { op, .. } = &command {
                self.launched.insert(*op);
                self.device_launches.fetch_add(1, Ordering::Relaxed);
            }
            self.sim.submit(command)
        }
        fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
            if self.known.pending() {
                self.local_polls.fetch_add(1, Ordering::Relaxed);
                self.known.take(events);
                return Ok(self.sim.now());
            }
            let t = self.sim.poll(events)?;
            let launched = &self.launched;
            self.known.learn(self.bound_after.drain(..), |op| launched.contains(&op));
            self.known_left.store(self.known.known(), Ordering::Relaxed);
            Ok(t)
        }
        fn take_failed(&mut self, out: &mut Vec<crate::backend::OpFailed>) {
            self.sim.take_failed(out)
        }
        fn take_answered(&mut self, events: &mut Vec<Event>) -> bool {
            if !self.known.pending() {
                return false;
            }
            self.known.take(events);
            true
        }
        fn next_wake(&self) -> Wake {
            if self.known.pending() {
                Wake::Spin
            } else {
                self.sim.next_wake()
            }
        }
    }

    /// Ends known ahead (`backend::ends_ahead`): a stream of 40 dependent
    /// launches whose kernels after the first the device reports ended
    /// ahead. The engine's launches of those are answered without the device
    /// (which runs only the first), each in the engine turn that made it, so
    /// the chain takes a few device rounds, not one per kernel; the stream's
    /// sync is answered in order after them all, every kernel counts as done,
    /// and nothing is left known once the stream drained; a second stream
    /// whose client leaves with ends reported and not launched leaves none
    /// behind either.
    #[test]
    fn launches_answered_from_ends_known_ahead_complete_a_stream_in_order_without_the_device() {
        let backend = AnswersAhead::new();
        let (answered, local_polls, device_launches, known_left) = (
            backend.answered.clone(),
            backend.local_polls.clone(),
            backend.device_launches.clone(),
            backend.known_left.clone(),
        );
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        let n = 40u64;
        for i in 0..n {
            assert!(core.handle(request(10 + i, launch_of(kernel))));
        }
        assert!(core.handle(request(100, Request::SyncStream(StreamId(0)))));
        assert_eq!(answer_to(&mut core, &replies, 100), Ok(Reply::Done));
        assert_eq!(device_launches.load(Ordering::Relaxed), 1, "the device ran only the first kernel");
        assert_eq!(answered.load(Ordering::Relaxed), n as usize - 1, "the ones after it were answered from their ends");
        let (rounds, in_turn) = core.device_rounds();
        assert_eq!(in_turn, n - 1, "each answer read in the turn that made its launch");
        assert_eq!(local_polls.load(Ordering::Relaxed), 0, "no round spent on a poll the device was not asked");
        assert!(rounds < n / 4, "{rounds} device rounds for a chain of {n} kernels");
        let done = core.sessions.get(&1).map(|s| s.counters.kernels_done);
        assert_eq!(done, Some(n), "every kernel counted as done");
        assert_eq!(known_left.load(Ordering::Relaxed), 0, "no end known for a kernel that was launched");
        assert_none_refused(&replies);

        // A client that leaves with kernels reported ended and not launched:
        // a long kernel first holds the rest back, then the client goes.
        let long = Launch { block_time_ns: Some(50_000_000), grid: [1_000, 1, 1], ..launch_of_struct(kernel) };
        assert!(core.handle(request(50, Request::Launch(long))));
        for i in 0..5 {
            assert!(core.handle(request(51 + i, launch_of(kernel))));
        }
        core.pump().expect("pump");
        core.pump().expect("pump");
        assert!(known_left.load(Ordering::Relaxed) > 0, "the kernels behind the long one were reported ended");
        core.disconnect(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while core.sessions.contains_key(&1) {
            core.pump().expect("pump");
            assert!(Instant::now() < deadline, "the client was not reaped in 10 s");
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(known_left.load(Ordering::Relaxed), 0, "ends of a gone client's kernels are forgotten");
    }

    /// Requests between rounds (`pump_requests`): a program's 40 dependent
    /// launches and its sync, sent at once, waiting in the core's inbox and
    /// in its channel while a pump runs the first. With a device that answers
    /// polls at once (no poll is ever out, as in the daemon's process, or
    /// while launches are answered from ends known ahead) a pump used to take
    /// none of them: they were bound only after it ended, at the core loop's
    /// next turn. Now pumps alone take every one, in order, the chain
    /// completes with its launches after the first answered from their ends,
    /// and the sync is answered. A message the pump may not handle (an
    /// allocation) holds its client's later requests in the inbox, in order.
    #[test]
    fn a_pump_takes_waiting_launches_between_its_rounds_and_turns_in_order() {
        let backend = AnswersAhead::new();
        let (answered, device_launches) = (backend.answered.clone(), backend.device_launches.clone());
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        assert!(core.handle(request(10, launch_of(kernel))));
        let (tx, rx) = std::sync::mpsc::channel();
        let n = 40u64;
        // Half moved to the inbox by the core's loop, the rest still in the channel.
        for i in 1..n / 2 {
            core.inbox.push(request(10 + i, launch_of(kernel)));
        }
        for i in n / 2..n {
            tx.send(request(10 + i, launch_of(kernel))).expect("the channel is open");
        }
        tx.send(request(100, Request::SyncStream(StreamId(0)))).expect("the channel is open");
        let deadline = Instant::now() + Duration::from_secs(10);
        let synced = loop {
            core.pump_with(Some(&rx)).expect("pump");
            let got = replies.try_iter().find_map(|f| match f {
                ServerFrame::Reply { id: 100, result } => Some(result),
                _ => None,
            });
            if let Some(r) = got {
                break r;
            }
            assert!(Instant::now() < deadline, "the sync was not answered in 10 s: pumps took no request");
            std::thread::sleep(Duration::from_micros(200));
        };
        assert_eq!(synced, Ok(Reply::Done));
        assert_eq!(core.round_clock.total.requests_between, n, "every launch after the first and the sync");
        assert!(core.inbox.is_empty(), "nothing left in the inbox");
        // Those bound before the device's next poll are reported ended ahead
        // (the script), and the others run on the device: each exactly once.
        let (answered, ran) = (answered.load(Ordering::Relaxed), device_launches.load(Ordering::Relaxed));
        assert_eq!(answered + ran, n as usize, "{answered} answered ahead and {ran} run: each kernel once");
        assert!(answered > 0, "kernels taken between rounds were queued ahead of the engine");
        let done = core.sessions.get(&1).map(|s| s.counters.kernels_done);
        assert_eq!(done, Some(n), "every kernel counted as done");
        assert_none_refused(&replies);

        // An allocation is not a pump's to handle: it and the launch after it
        // wait (in the inbox or still in the channel), in order. A launch
        // first, so that the pump has rounds after its first.
        assert!(core.handle(request(199, launch_of(kernel))));
        tx.send(request(200, Request::Alloc { bytes: 4096 })).expect("the channel is open");
        tx.send(request(201, launch_of(kernel))).expect("the channel is open");
        let stats = core.pump_with(Some(&rx)).expect("pump");
        assert!(stats.rounds > 1, "the pump had a round to take requests in");
        assert_eq!(stats.requests_between, 0, "the launch did not overtake the allocation");
        assert_eq!(
            core.inbox.len() + rx.try_iter().count(),
            2,
            "the allocation and the launch wait for the core's loop"
        );
    }

    /// Ends known ahead in the daemon's process (`backend::answers_ahead`):
    /// the simulated device scripted to report every one-block kernel bound
    /// after another as ended ahead, in-process, behind the wrapper the
    /// daemon puts around a device in its process. A chain of 40 completes
    /// in order with its launches after the first answered in the turn that
    /// made them (a few device rounds), no SM left held, every kernel done;
    /// the simulated device ran only the first.
    #[test]
    fn in_process_a_chain_the_device_ran_ahead_completes_in_a_few_rounds() {
        let mut sim = SimBackend::with_info(gpumux_sim::presets::h100());
        sim.script_ends_ahead();
        let backend = crate::backend::answers_ahead::AnswersAhead::new(Box::new(sim));
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        let n = 40u64;
        for i in 0..n {
            assert!(core.handle(request(10 + i, launch_of(kernel))));
        }
        assert!(core.handle(request(100, Request::SyncStream(StreamId(0)))));
        assert_eq!(answer_to(&mut core, &replies, 100), Ok(Reply::Done));
        assert_eq!(core.ends_answered(), n - 1, "every kernel after the first answered from its end");
        let (rounds, in_turn) = core.device_rounds();
        assert_eq!(in_turn, n - 1, "each answer read in the turn that made its launch");
        assert!(rounds < n / 4, "{rounds} device rounds for a chain of {n} kernels");
        assert_eq!(core.sms_held(), 0, "no launch left holding SMs");
        let done = core.sessions.get(&1).map(|s| s.counters.kernels_done);
        assert_eq!(done, Some(n), "every kernel counted as done");
        assert_none_refused(&replies);
        // Still in step: one more launch, and a sync.
        assert!(core.handle(request(200, launch_of(kernel))));
        assert!(core.handle(request(201, Request::SyncStream(StreamId(0)))));
        assert_eq!(answer_to(&mut core, &replies, 201), Ok(Reply::Done));
    }

    /// The core's own work per kernel of a chain the device ran ahead (the
    /// chain program's path on a GPU, issue 35), without threads or sockets:
    /// a measurement run by hand, under callgrind for counts that do not
    /// depend on the machine's load (docs/program-speed.md says how). It
    /// checks the chain completes; the time it prints is the core's alone.
    #[test]
    #[ignore = "a measurement: run by hand (docs/program-speed.md)"]
    fn the_cores_work_per_kernel_of_a_chain_run_ahead() {
        let mut sim = SimBackend::with_info(gpumux_sim::presets::h100());
        sim.script_ends_ahead();
        let backend = crate::backend::answers_ahead::AnswersAhead::new(Box::new(sim));
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        let grid = std::env::var("GPUMUX_COST_GRID").ok().and_then(|g| g.parse().ok()).unwrap_or(64u32);
        let (batches, per_batch) = (50u64, 40u64);
        let mut busy = Duration::ZERO;
        for b in 0..batches {
            let t = Instant::now();
            for i in 0..per_batch {
                let mut l = launch_of_struct(kernel);
                l.grid = [grid, 1, 1];
                assert!(core.handle(request(1_000 + b * 1_000 + i, Request::Launch(l))));
            }
            let sync = 1_000 + b * 1_000 + 999;
            assert!(core.handle(request(sync, Request::SyncStream(StreamId(0)))));
            core.pump().expect("pump");
            busy += t.elapsed();
            assert_eq!(answer_to(&mut core, &replies, sync), Ok(Reply::Done));
        }
        let n = batches * per_batch;
        assert_eq!(core.sessions.get(&1).map(|s| s.counters.kernels_done), Some(n));
        assert_eq!(core.sms_held(), 0, "no launch left holding SMs");
        let (rounds, in_turn) = core.device_rounds();
        eprintln!(
            "{n} kernels of {grid} blocks: {:.2} µs of the core's first pump per kernel (requests, engine, \
             the device's answers ahead); {rounds} device rounds, {in_turn} answered in turn; {}",
            busy.as_secs_f64() * 1e6 / n as f64,
            core.round_clock.summary().unwrap_or_default()
        );
    }

    /// The simulator behind a poll that waits for a launch's end while the
    /// device is busy (as a held poll waits for news), logging the binds and
    /// launch commands in the order they reach the device.
    struct PollsForNews {
        sim: SimBackend,
        log: Arc<std::sync::Mutex<Vec<(&'static str, OpId)>>>,
        /// Launches sent and not seen ended: a poll waits only while there are some.
        running: usize,
    }

    impl Backend for PollsForNews {
        delegate_to_sim!(start_load, unbind, take_failed, next_wake);
        fn bind(&mut self, op: OpId, work: OpWork) {
            self.log.lock().expect("not poisoned").push(("bind", op));
            self.sim.bind(op, work)
        }
        fn submit(&mut self, command: Command) -> Result<(), Failure> {
            if let Command::Launch { op, .. } = &command {
                self.log.lock().expect("not poisoned").push(("launch", *op));
                self.running += 1;
            }
            self.sim.submit(command)
        }
        fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let before = events.len();
                let now = self.sim.poll(events)?;
                let ended = events[before..].iter().filter(|e| matches!(e, Event::LaunchEnded { .. })).count();
                self.running = self.running.saturating_sub(ended);
                if ended > 0 || self.running == 0 || Instant::now() > deadline {
                    return Ok(now);
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Where a round's requests are taken (`pump_requests`, "Requests between
    /// rounds"): when a client's kernel ends and the next on its stream is
    /// launched, another client's launch waiting in the inbox is bound
    /// before that launch (client 2's bind C and client 1's second launch B,
    /// after A's end, as positions in the log of what reached the device);
    /// and it still runs and completes.
    #[test]
    fn a_rounds_requests_are_bound_before_its_launches() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let backend =
            PollsForNews { sim: SimBackend::with_info(gpumux_sim::presets::h100()), log: log.clone(), running: 0 };
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        // A second client with its own module.
        let (kernel2, rx2) = connect_with_kernel(&mut core, 2);
        let msg2 = |id, request| request_of(2, id, request);
        // Client 1: A, then B behind it on its stream; client 2's C waits in the inbox.
        let mut long = launch_of_struct(kernel);
        long.block_time_ns = Some(200_000);
        assert!(core.handle(request(10, Request::Launch(long))));
        assert!(core.handle(request(11, launch_of(kernel))));
        core.inbox.push(msg2(10, launch_of(kernel2)));
        log.lock().expect("not poisoned").clear();
        let (_tx, rx) = std::sync::mpsc::channel();
        core.pump_with(Some(&rx)).expect("pump");
        let got = log.lock().expect("not poisoned").clone();
        let launches: Vec<usize> = (0..got.len()).filter(|&i| got[i].0 == "launch").collect();
        assert!(launches.len() >= 2, "A and B launched in the pump: {got:?}");
        let Some(bind_c) = got.iter().position(|e| e.0 == "bind") else {
            panic!("C was not taken between rounds: {got:?}")
        };
        assert!(bind_c < launches[1], "C's bind came before B's launch: {got:?}");
        // Everything completes, C included.
        assert!(core.handle(request(12, Request::SyncStream(StreamId(0)))));
        assert_eq!(answer_to(&mut core, &replies, 12), Ok(Reply::Done));
        assert!(core.handle(msg2(11, Request::SyncStream(StreamId(0)))));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            core.pump().expect("pump");
            if rx2.try_iter().any(|f| matches!(f, ServerFrame::Reply { id: 11, result: Ok(Reply::Done) })) {
                break;
            }
            assert!(Instant::now() < deadline, "client 2's sync was not answered");
        }
        let done = |c| core.sessions.get(&c).map(|s| s.counters.kernels_done);
        assert_eq!((done(1), done(2)), (Some(2), Some(1)), "every kernel ran once");
    }

    /// The core's own work per launch of 8 clients launching empty kernels
    /// asynchronously (the launch-rate experiment's pattern, issue 35), on
    /// the simulated device in the daemon's process, without threads or
    /// sockets: a measurement run by hand under callgrind, as the chain's
    /// above (docs/program-speed.md, "The core's work per launch of 8
    /// clients"). It checks every kernel completes.
    #[test]
    #[ignore = "a measurement: run by hand (docs/program-speed.md)"]
    fn the_cores_work_per_launch_of_eight_clients() {
        let sim = SimBackend::with_info(gpumux_sim::presets::h100());
        let (mut core, first, replies) = core_with_kernel_on(Box::new(sim));
        let (clients, per_client, batches) = (8u64, 32u64, 25u64);
        let mut kernels = vec![(1u64, first, replies)];
        for client in 2..=clients {
            let (kernel, rx) = connect_with_kernel(&mut core, client);
            kernels.push((client, kernel, rx));
        }
        let mut busy = Duration::ZERO;
        for b in 0..batches {
            let t = Instant::now();
            for i in 0..per_client {
                for (client, kernel, _) in &kernels {
                    let id = 1_000 + b * 1_000 + i;
                    assert!(core.handle(request_of(*client, id, launch_of(*kernel))));
                }
                // The pattern of the clients' launches reaching the core
                // while their kernels run: a pump every round of 8.
                core.pump().expect("pump");
            }
            let sync = 1_000 + b * 1_000 + 999;
            for (client, _, _) in &kernels {
                assert!(core.handle(request_of(*client, sync, Request::SyncStream(StreamId(0)))));
            }
            busy += t.elapsed();
            for (client, _, rx) in &kernels {
                let deadline = Instant::now() + Duration::from_secs(60);
                'answer: loop {
                    core.pump().expect("pump");
                    for f in rx.try_iter() {
                        if let ServerFrame::Reply { id, result } = f {
                            assert!(result.is_ok(), "client {client}'s request {id} was refused: {result:?}");
                            if id == sync {
                                break 'answer;
                            }
                        }
                    }
                    assert!(Instant::now() < deadline, "client {client}'s sync of batch {b} not answered");
                }
            }
        }
        let n = clients * per_client * batches;
        let done: u64 = (1..=clients).filter_map(|c| core.sessions.get(&c)).map(|s| s.counters.kernels_done).sum();
        assert_eq!(done, n, "every kernel counted as done");
        assert_eq!(core.sms_held(), 0, "no launch left holding SMs");
        let (rounds, _) = core.device_rounds();
        eprintln!(
            "{n} launches of {clients} clients: {:.2} µs of the core per launch until the syncs were sent; \
             {rounds} device rounds; {}",
            busy.as_secs_f64() * 1e6 / n as f64,
            core.round_clock.summary().unwrap_or_default()
        );
    }

    /// A launch shares the engine description of the launch before it only
    /// when it is the same kernel with the same shape and block time
    /// (`Session::last_desc`, issue 35): every other launch gets its own.
    #[test]
    fn a_launch_shares_the_description_of_the_same_launch_before_it_and_no_other() {
        let (mut core, kernel, _replies) = core_with_kernel(PollsLate::new());
        let shapes: [(u32, u64); 5] = [(4, 1_000), (4, 1_000), (8, 1_000), (8, 2_000), (4, 1_000)];
        for (i, &(x, time)) in shapes.iter().enumerate() {
            let mut l = launch_of_struct(kernel);
            l.grid = [x, 1, 1];
            l.block_time_ns = Some(time);
            assert!(core.handle(request(10 + i as u64, Request::Launch(l))));
        }
        let mut descs: Vec<(OpId, Arc<gpumux_engine::kernel::KernelDesc>)> = core
            .ops
            .iter()
            .filter_map(|(op, e)| match &e.kind {
                OpKind::Kernel { desc } => Some((*op, Arc::clone(desc))),
                _ => None,
            })
            .collect();
        descs.sort_by_key(|d| d.0);
        assert_eq!(descs.len(), shapes.len(), "every launch is an operation");
        for ((_, d), &(x, time)) in descs.iter().zip(&shapes) {
            assert_eq!(d.shape.blocks, u64::from(x), "a launch's description has its own grid");
            assert_eq!(d.sim_timing.map(|t| t.block_time_ns), Some(time), "and its own block time");
        }
        let shared: Vec<bool> = descs.windows(2).map(|w| Arc::ptr_eq(&w[0].1, &w[1].1)).collect();
        assert_eq!(shared, [true, false, false, false], "only the repeat of the launch just before shares");
    }

    /// Clients launching in turn (8 clients' launch-rate pattern) each share
    /// the description of their own launch before (`Session::last_desc`),
    /// never another client's: one description for the whole core was
    /// replaced at every launch, and none was shared.
    #[test]
    fn clients_launching_in_turn_each_share_their_own_launch_before() {
        let (mut core, kernel1, _replies) = core_with_kernel(PollsLate::new());
        let (kernel2, _rx2) = connect_with_kernel(&mut core, 2);
        for i in 0..3 {
            assert!(core.handle(request_of(1, 10 + i, launch_of(kernel1))));
            assert!(core.handle(request_of(2, 10 + i, launch_of(kernel2))));
        }
        let mut descs: Vec<(OpId, u64, Arc<gpumux_engine::kernel::KernelDesc>)> = core
            .ops
            .iter()
            .filter_map(|(op, e)| match &e.kind {
                OpKind::Kernel { desc } => Some((*op, e.client, Arc::clone(desc))),
                _ => None,
            })
            .collect();
        descs.sort_by_key(|d| d.0);
        let clients: Vec<u64> = descs.iter().map(|d| d.1).collect();
        assert_eq!(clients, [1, 2, 1, 2, 1, 2], "the launches in the order they came");
        for client in [1, 2] {
            let own: Vec<_> = descs.iter().filter(|d| d.1 == client).collect();
            assert!(own.windows(2).all(|w| Arc::ptr_eq(&w[0].2, &w[1].2)), "client {client} shares its own");
        }
        assert!(
            descs.windows(2).all(|w| !Arc::ptr_eq(&w[0].2, &w[1].2)),
            "no description is shared between the two clients"
        );
    }

    /// The simulator behind a device that refuses the binding of every
    /// kernel launched with a grid x of [`REFUSED_X`], as the CUDA device's
    /// own guard refuses one the daemon's checks let through: the launch
    /// ends at once having run nothing, and `take_failed` says why.
    struct Refusing {
        sim: SimBackend,
        refused: HashSet<OpId>,
        pending: Vec<Event>,
        failed: Vec<crate::backend::OpFailed>,
    }

    const REFUSED_X: u32 = 7;

    impl Backend for Refusing {
        delegate_to_sim!(start_load);
        fn bind(&mut self, op: OpId, work: OpWork) {
            if matches!(work, OpWork::Kernel { grid: [REFUSED_X, ..], .. }) {
                self.refused.insert(op);
            }
            self.sim.bind(op, work)
        }
        fn unbind(&mut self, op: OpId) {
            self.refused.remove(&op);
            self.sim.unbind(op)
        }
        fn submit(&mut self, command: Command) -> Result<(), Failure> {
            if let Some(op) = crate::backend::refused_op(&command).filter(|op| self.refused.contains(op)) {
                self.failed.push(crate::backend::OpFailed { op, why: "a grid the device refuses".into() });
                self.pending.extend(crate::backend::ended_at_once(&command));
                return Ok(());
            }
            self.sim.submit(command)
        }
        fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
            events.append(&mut self.pending);
            self.sim.poll(events)
        }
        fn take_failed(&mut self, out: &mut Vec<crate::backend::OpFailed>) {
            out.append(&mut self.failed);
        }
        fn next_wake(&self) -> Wake {
            if self.pending.is_empty() {
                self.sim.next_wake()
            } else {
                Wake::Spin
            }
        }
    }

    /// Pumps `core` until `replies` brings the answer to request `id`.
    fn answer_to(
        core: &mut Core,
        replies: &std::sync::mpsc::Receiver<ServerFrame>,
        id: u64,
    ) -> Result<Reply, ErrorReply> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            core.pump().expect("pump");
            for f in replies.try_iter() {
                if let ServerFrame::Reply { id: got, result } = f {
                    if got == id {
                        return result;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no answer to request {id} in 10 s");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Issue 36, case 0: a launch the device refuses (on 717b546 the CUDA
    /// device's refused binding was only logged, and the client's sync
    /// answered `Done`: a silent wrong result) fails for its client, sticky
    /// on its stream: the next sync reports it with the reason, a second sync
    /// is clean again, and the daemon goes on serving.
    #[test]
    fn a_launch_the_device_refuses_fails_the_next_sync_of_its_stream_and_only_that() {
        let backend = Refusing {
            sim: SimBackend::with_info(gpumux_sim::presets::h100()),
            refused: HashSet::new(),
            pending: Vec::new(),
            failed: Vec::new(),
        };
        let (mut core, kernel, replies) = core_with_kernel_on(Box::new(backend));
        let refused = Request::Launch(Launch { grid: [REFUSED_X, 1, 1], ..launch_of_struct(kernel) });
        assert!(core.handle(request(3, refused)));
        assert!(core.handle(request(4, launch_of(kernel))));
        assert!(core.handle(request(5, Request::SyncStream(StreamId(0)))));
        let e = answer_to(&mut core, &replies, 5).expect_err("the sync after a refused launch fails");
        assert_eq!(e.kind, ErrorKind::Device, "{e:?}");
        assert!(
            e.message.contains("did not run") && e.message.contains("a grid the device refuses"),
            "the reason reaches the client: {}",
            e.message
        );
        // Reported once: the stream is clean again, and the daemon serves on.
        assert!(core.handle(request(6, launch_of(kernel))));
        assert!(core.handle(request(7, Request::SyncStream(StreamId(0)))));
        assert_eq!(answer_to(&mut core, &replies, 7), Ok(Reply::Done));
    }

    /// A client that sends module loads without waiting for them has at most
    /// `MAX_LOADS_UNDER_WAY` compiling; the next is refused at once with the
    /// limit (each held its source until its compile ended, with no bound:
    /// issue 36's review of the compiles moved off the core).
    #[test]
    fn a_client_has_at_most_eight_loads_compiling() {
        let backend = PollsLate::new();
        let hold = backend.hold_loads.clone();
        let (mut core, _, replies) = core_with_kernel(backend);
        hold.store(true, Ordering::Relaxed);
        let load = || Request::LoadModule {
            name: "n.cu".into(),
            source: "__global__ void n() {}\n".into(),
            options: Vec::new(),
        };
        for i in 0..MAX_LOADS_UNDER_WAY as u64 + 1 {
            assert!(core.handle(request(10 + i, load())));
        }
        core.pump().expect("pump");
        let answers: Vec<(u64, Result<Reply, ErrorReply>)> = replies
            .try_iter()
            .filter_map(|f| match f {
                ServerFrame::Reply { id, result } if id >= 10 => Some((id, result)),
                _ => None,
            })
            .collect();
        assert_eq!(answers.len(), 1, "only the load over the limit is answered (refused): {answers:?}");
        let (id, result) = &answers[0];
        assert_eq!(*id, 10 + MAX_LOADS_UNDER_WAY as u64);
        let e = result.as_ref().expect_err("refused");
        assert_eq!(e.kind, ErrorKind::Quota);
        assert!(e.message.contains("8"), "names the limit: {}", e.message);
    }
}
