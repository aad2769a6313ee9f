//! Helpers shared by the analyses' tests (`analysis`, `syncs`).

use crate::analysis::Line;

/// Moves a line of daemon 1 (device process 2, clients above) to a second
/// daemon 1 s later: daemon 3, device process 4, client 8. The tests of two
/// daemons' stamps in one folder retag their own keys.
pub(crate) fn as_second_daemon(l: &mut Line) {
    l.ns += 1_000_000_000;
    l.pid = match l.pid {
        1 => 3,
        2 => 4,
        _ => 8,
    };
    l.ppid = if l.pid == 4 { 3 } else { 0 };
}
