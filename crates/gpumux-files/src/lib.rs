//! The files a person hands gpumux, or asks it to write, and the user text
//! that ends up in messages. Shared by the workload parser (`gpumux-workload`),
//! the real-time task-set parser (`gpumux-rt`) and the commands that write
//! results, so that every input gets the same limits and every message the
//! same care:
//!
//! * [`read`]: a file read through a bounded reader, so `/dev/zero`, a FIFO
//!   or `/dev/stdin` fed by `yes` fail at a size limit instead of exhausting
//!   memory; non-UTF-8 input is reported with its byte offset.
//! * [`output`]: output files and folders checked before the work starts, so
//!   an unwritable `--plot` or `--trace` fails in a second, not after a run.
//! * [`text`]: names (non-empty, no control or bidirectional-override
//!   characters, bounded length), short quotes of user text, readable
//!   numbers, and TOML syntax errors as line, column and a bounded message.

#![warn(missing_docs)]

pub mod output;
pub mod read;
pub mod text;

pub use read::{read_text, MAX_FILE_BYTES};
