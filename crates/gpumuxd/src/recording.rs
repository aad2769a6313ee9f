//! The format of `gpumuxd --record FILE`: one JSON object a line, what the
//! daemon's clients did and when, for `gpumux replay` to turn into a workload
//! (docs/calibration.md, "Replaying the daemon's clients"). The core writes it
//! (`core/record.rs`); this module is only the lines, shared by the writer and
//! the readers.
//!
//! Times are the core's clock (`Backend::now`, ns since the device opened).
//! Lines come in the order the core saw things: a client's `hello` before its
//! operations, an operation when it completed (so operations of one client
//! may come out of submission order across streams), `gone` when it left.

use serde::{Deserialize, Serialize};

/// The recording format's version; a reader refuses others.
pub const FORMAT: u32 = 1;

/// One line of a recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Line {
    /// The first line: which daemon recorded.
    Daemon {
        /// [`FORMAT`].
        format: u32,
        /// The device in words (`Backend::describe`).
        device: String,
        /// The scheduling policy's name.
        policy: String,
        /// The device's SMs.
        sms: u32,
        /// When recording started.
        at_ns: u64,
    },
    /// A client greeted the daemon (`Hello` accepted).
    Hello {
        /// The daemon's number for it.
        client: u64,
        /// Its name (printable: `gpumux_proto::printable_name`).
        name: String,
        /// Its priority.
        priority: i32,
        /// Its weight.
        weight: f64,
        /// When.
        at_ns: u64,
    },
    /// A client changed its priority (`SetPriority`).
    Priority {
        /// Whose.
        client: u64,
        /// The new priority.
        priority: i32,
        /// When.
        at_ns: u64,
    },
    /// An operation of a client's stream completed (or was dropped).
    Op(OpLine),
    /// A client left (its socket closed or it said `Goodbye`).
    Gone {
        /// Whose.
        client: u64,
        /// When.
        at_ns: u64,
    },
}

/// One finished operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpLine {
    /// Whose.
    pub client: u64,
    /// The engine's id for it: ids grow in submission order, over all clients.
    pub op: u64,
    /// The client's stream.
    pub stream: u32,
    /// What it was.
    pub what: What,
    /// When the core submitted it to the engine.
    pub submitted_ns: u64,
    /// When the core first sent it to the device (a kernel's first launch, a
    /// copy's start); `None` for markers (syncs, events), which never go there.
    pub started_ns: Option<u64>,
    /// When the core saw it complete.
    pub ended_ns: u64,
    /// Whether the client was answered at its end (a sync, a copy through the
    /// shared region, a host function's marker): where a client's host may
    /// have waited for it.
    pub reply: bool,
    /// Device launches it took (more than one when it was preempted and resumed).
    pub launches: u32,
    /// SMs of its first launch (0 for anything but a kernel).
    pub sms: u32,
    /// `false` when it was dropped without running (its client left).
    pub completed: bool,
}

/// What an operation was.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum What {
    /// A kernel launch.
    Kernel {
        /// The kernel's name.
        name: String,
        /// Grid, blocks.
        grid: [u32; 3],
        /// Block, threads.
        block: [u32; 3],
        /// Shared memory per block, static and dynamic, bytes.
        shared_bytes: u32,
        /// Registers per thread as the device reports them.
        regs_per_thread: u32,
        /// The client's hint for a simulated device (`LaunchConfig::block_time_ns`).
        block_time_ns: u64,
    },
    /// Host to device.
    H2d {
        /// How many bytes.
        bytes: u64,
    },
    /// Device to host.
    D2h {
        /// How many bytes.
        bytes: u64,
    },
    /// Device to device: a copy, memset or fill.
    D2d {
        /// How many bytes.
        bytes: u64,
    },
    /// A stream synchronisation the client waited for (`SyncStream`).
    Sync,
    /// A recorded event (a marker).
    Event,
    /// A wait for another stream's event (`StreamWaitEvent`).
    Wait,
    /// A host function's marker, or its hold.
    HostFunc,
}

impl Line {
    /// The line as written (no newline).
    pub fn to_json(&self) -> String {
        // Serialising these types cannot fail: no maps with non-string keys, no
        // non-finite float but a weight, which the daemon checks is finite.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"kind\":\"unwritable\",\"why\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of line reads back as written, one JSON object a line.
    #[test]
    fn lines_round_trip() {
        let op = |what: What| {
            Line::Op(OpLine {
                client: 3,
                op: 7,
                stream: 1,
                what,
                submitted_ns: 10,
                started_ns: Some(12),
                ended_ns: 20,
                reply: true,
                launches: 1,
                sms: 66,
                completed: true,
            })
        };
        let lines = [
            Line::Daemon { format: FORMAT, device: "sim:h100".into(), policy: "fcfs".into(), sms: 132, at_ns: 0 },
            Line::Hello { client: 3, name: "a \"quoted\"\\name".into(), priority: -2, weight: 0.5, at_ns: 1 },
            Line::Priority { client: 3, priority: 4, at_ns: 2 },
            op(What::Kernel {
                name: "k".into(),
                grid: [4, 2, 1],
                block: [256, 1, 1],
                shared_bytes: 1024,
                regs_per_thread: 32,
                block_time_ns: 5000,
            }),
            op(What::H2d { bytes: 1 << 20 }),
            op(What::D2h { bytes: 4 }),
            op(What::D2d { bytes: 8 }),
            op(What::Sync),
            op(What::Event),
            op(What::Wait),
            op(What::HostFunc),
            Line::Gone { client: 3, at_ns: 30 },
        ];
        for l in lines {
            let text = l.to_json();
            assert!(!text.contains('\n'), "one line: {text}");
            let back: Line = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(back, l, "{text}");
        }
    }
}
