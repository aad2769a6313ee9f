//! `ppq-even`: priority levels preempt as under PPQ, and the processes of one
//! level split the SMs evenly, keep their share across their kernels, and keep
//! it from their peers for a while after they go idle.

mod common;

use common::{kernel, Bench, PER_SM, SMS, WAVE_NS};
use gpumux_engine::policies::ppq_even::DEFAULT_LINGER;
use gpumux_engine::{Command, OpOutcome, StreamOp};

const HALF: u32 = SMS as u32 / 2;

fn retreats(b: &Bench, from: u64) -> usize {
    b.commands_since(from).filter(|c| matches!(c, Command::Retreat { .. })).count()
}

#[test]
fn two_equal_clients_run_side_by_side_on_half_the_sms_each() {
    let mut b = Bench::new("ppq-even-drain");
    let (x, y) = (b.add(0, 0), b.add(1, 0));
    for _ in 0..3 {
        b.submit(x, kernel("x", 4));
        b.submit(y, kernel("y", 4));
    }
    b.run(Some(WAVE_NS / 2));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF));
    // Each keeps its half from one kernel to the next: nothing is ever taken back.
    b.run(Some(5 * WAVE_NS));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF), "after the first kernels");
    b.run(None);
    assert_eq!(retreats(&b, 0), 0, "equal clients with queued kernels never preempt each other");
    assert_eq!(b.outcomes(x), vec![OpOutcome::Completed; 3]);
    assert_eq!(b.outcomes(y), vec![OpOutcome::Completed; 3]);
    assert!(b.dev.ran_twice().is_empty(), "{:?}", b.dev.ran_twice());
}

#[test]
fn a_peer_arriving_takes_half_from_the_one_holding_everything() {
    let mut b = Bench::new("ppq-even-drain");
    let first = b.add(0, 0);
    b.submit(first, kernel("first", 20));
    b.run(Some(WAVE_NS / 2));
    assert_eq!(b.sms_running(0).len(), SMS as u32, "alone, it has every SM");
    let late = b.add(1, 0);
    b.submit(late, kernel("late", 2));
    b.run(Some(2 * WAVE_NS));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF));
    b.run(None);
    let k = b.kernel_of(0).expect("launched");
    assert_eq!(b.dev.blocks_done(k), 20 * PER_SM * SMS as u64, "the first lost no block to the split");
    assert_eq!(b.outcomes(late), vec![OpOutcome::Completed]);
    assert!(b.dev.ran_twice().is_empty(), "{:?}", b.dev.ran_twice());
}

#[test]
fn an_urgent_client_takes_every_sm_and_the_peers_split_again_after_it() {
    let mut b = Bench::new("ppq-even-drain");
    let (x, y) = (b.add(0, 0), b.add(1, 0));
    b.submit(x, kernel("x", 20));
    b.submit(y, kernel("y", 20));
    b.run(Some(WAVE_NS / 2));
    let urgent = b.add(2, 5);
    let at = b.now;
    b.submit(urgent, kernel("urgent", 1));
    b.run(Some(at + 3 * WAVE_NS / 2));
    let k = b.kernel_of(2).expect("the urgent kernel launched");
    assert_eq!(b.sms_given(k, at).len(), SMS as u32, "the urgent kernel got every SM");
    assert_eq!(b.outcomes(urgent), vec![OpOutcome::Completed]);
    b.run(Some(at + 3 * WAVE_NS));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF), "back to an even split");
    b.run(None);
    assert_eq!(b.outcomes(x), vec![OpOutcome::Completed]);
    assert_eq!(b.outcomes(y), vec![OpOutcome::Completed]);
    assert!(b.dev.ran_twice().is_empty(), "{:?}", b.dev.ran_twice());
}

#[test]
fn an_idle_peer_keeps_its_share_from_its_peers_for_the_linger_but_not_from_lower_levels() {
    let mut b = Bench::new("ppq-even-drain");
    let (short, long) = (b.add(0, 0), b.add(1, 0));
    b.submit(short, kernel("short", 1));
    b.submit(long, kernel("long", 400));
    b.run(Some(WAVE_NS / 2));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF));
    // The short one's kernel ends (2 waves on half the SMs); its peer does not grow onto its half.
    b.run(Some(3 * WAVE_NS));
    assert_eq!(b.outcomes(short), vec![OpOutcome::Completed]);
    assert_eq!(b.sms_running(1).len(), HALF, "the peer waits out the linger");
    // A lower level may use the idle half meanwhile.
    let low = b.add(2, -1);
    b.submit(low, kernel("low", 400));
    b.run(Some(4 * WAVE_NS));
    assert_eq!(b.sms_running(2).len(), HALF, "the lower level uses the lingering share");
    // The idle client comes back within the linger: its half is free again.
    let back = b.now;
    b.submit(short, kernel("short again", 1));
    b.run(Some(back + WAVE_NS / 2));
    assert_eq!((b.sms_running(0).len(), b.sms_running(1).len()), (HALF, HALF));
    assert_eq!(b.sms_running(2).len(), 0, "the lower level gave the share back");
    // Once it has been idle longer than the linger, the peer has every SM.
    b.run(Some(back + 3 * WAVE_NS + DEFAULT_LINGER + WAVE_NS));
    assert_eq!(b.sms_running(1).len(), SMS as u32, "after the linger the peer has the whole GPU");
}

/// Two clients launching one-block kernels one at a time (launch, wait for
/// its end, a short pause, again), beside a peer whose grid never ends
/// (issue 36's huge-grids abuser): once the split has settled, no small
/// kernel takes an SM from the grid, and the grid never grows back, so a
/// small kernel costs the grid's workers nothing (on the CUDA device each
/// retreat is a per-SM leave and each grow a restart of the grid's workers,
/// a few device rounds on the small kernel's path). Returns the retreats
/// and grows sent after the first kernels.
fn small_kernels_beside_an_endless_grid(mut b: Bench) -> (usize, usize) {
    let grid = b.add(0, 0);
    let smalls = [b.add(1, 0), b.add(2, 0)];
    // 10,000 waves: it outlasts the test by far.
    b.submit(grid, kernel("grid", 10_000));
    b.run(Some(WAVE_NS / 2));
    assert_eq!(b.sms_running(0).len(), SMS as u32, "alone, the grid has every SM");
    let pause = WAVE_NS / 4;
    let mut next_at = [b.now, b.now + WAVE_NS / 3];
    let mut launched = [0usize; 2];
    let mut settled_at = None;
    while launched.iter().min() < Some(&40) {
        for (i, &slot) in smalls.iter().enumerate() {
            let done = b.outcomes(slot).len();
            if done == launched[i] && b.now >= next_at[i] {
                b.submit(slot, StreamOp::Kernel { desc: common::desc("small", 1), time_key: 0 });
                launched[i] += 1;
            }
        }
        if settled_at.is_none() && launched.iter().all(|&n| n >= 3) {
            settled_at = Some(b.now);
        }
        let before = [b.outcomes(smalls[0]).len(), b.outcomes(smalls[1]).len()];
        b.run(Some(b.now + 500));
        for i in 0..2 {
            if b.outcomes(smalls[i]).len() > before[i] {
                next_at[i] = b.now + pause;
            }
        }
    }
    let from = settled_at.expect("settled");
    let grows = b.commands_since(from).filter(|c| matches!(c, Command::Grow { .. })).count();
    for slot in smalls {
        assert!(b.outcomes(slot).iter().filter(|o| **o == OpOutcome::Completed).count() >= 39, "small kernels ran");
    }
    assert!(b.dev.ran_twice().is_empty(), "{:?}", b.dev.ran_twice());
    (retreats(&b, from), grows)
}

#[test]
fn small_kernels_beside_an_endless_grid_take_no_sm_from_it() {
    let (retreats, grows) = small_kernels_beside_an_endless_grid(Bench::new("ppq-even-drain"));
    assert_eq!((retreats, grows), (0, 0), "retreats and grows of the grid for 2 x 37 small kernels");
}

#[test]
fn small_kernels_beside_an_endless_grid_take_no_sm_from_it_on_a_device_freeing_at_once() {
    let (retreats, grows) = small_kernels_beside_an_endless_grid(Bench::freeing_at_once("ppq-even-drain"));
    assert_eq!((retreats, grows), (0, 0), "retreats and grows of the grid for 2 x 37 small kernels");
}
