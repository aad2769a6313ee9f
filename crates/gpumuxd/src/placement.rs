//! Which GPU a client goes to when it connects (docs/multi-gpu.md,
//! "Placement"): a pure choice over the GPUs' loads, so that the policies
//! are tested without a daemon. The client stays on the GPU it was given
//! (its streams, buffers and kernels live there, and nothing moves under a
//! kernel), unless `--rebalance` moves it, idle, to a GPU left with no
//! client ([`rebalance_to`]; `core/handover.rs`).

use gpumux_proto::ClientClass;

/// A placement policy (`[daemon] placement`, `--placement`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The GPU with the fewest clients, then the fewest operations queued
    /// or running, then the lowest index.
    LeastLoaded,
    /// The GPU with the most free device memory, then the fewest clients,
    /// then the lowest index.
    Memory,
    /// Like `least-loaded`, but a client that declares its class
    /// (`Hello::class`, `GPUMUX_CLASS`) counts a complementary pair on one GPU
    /// (one memory-bound, one compute-bound client) as the load of one: it
    /// goes where it adds the least such load, and on a tie where it
    /// completes a pair, then to the fewest clients. Where no client
    /// declares a class, placement is exactly `least-loaded`'s ([`pair_load`]).
    /// The default: docs/multi-gpu.md says why.
    Pairs,
}

/// The policy when none is named.
pub const DEFAULT_PLACEMENT: Placement = Placement::Pairs;

/// The names `--placement` takes.
pub const NAMES: [&str; 3] = ["least-loaded", "memory", "pairs"];

impl std::str::FromStr for Placement {
    type Err = UnknownPlacement;

    fn from_str(s: &str) -> Result<Placement, UnknownPlacement> {
        match s {
            "least-loaded" => Ok(Placement::LeastLoaded),
            "memory" => Ok(Placement::Memory),
            "pairs" => Ok(Placement::Pairs),
            other => Err(UnknownPlacement(other.to_string())),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::LeastLoaded => "least-loaded",
            Placement::Memory => "memory",
            Placement::Pairs => "pairs",
        })
    }
}

/// A placement name that is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown placement `{0}`; known: least-loaded, memory, pairs")]
pub struct UnknownPlacement(pub String);

/// One GPU as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLoad {
    /// Its core still runs (a GPU whose core stopped takes no one).
    pub up: bool,
    /// Clients placed on it and still connected.
    pub clients: u32,
    /// Of those, the ones that declared themselves memory-bound.
    pub memory_bound: u32,
    /// And compute-bound.
    pub compute_bound: u32,
    /// Operations queued or running on it.
    pub ops: u32,
    /// Device memory no client holds, bytes.
    pub memory_free: u64,
}

/// Why a client cannot be placed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlaceError {
    /// The client pinned itself to a GPU the daemon does not serve.
    #[error("no GPU {asked}: this daemon serves GPU {serving} (GPUMUX_GPU or Hello's gpu names one of them)")]
    NoSuchGpu {
        /// The GPU asked for.
        asked: u32,
        /// The ones served, `0, 1`.
        serving: String,
    },
    /// The client pinned itself to a GPU whose core has stopped.
    #[error("GPU {asked} has stopped serving (its device failed for good); GPU {up} still serve")]
    Down {
        /// The GPU asked for.
        asked: u32,
        /// The ones still up, `0`, or `none`.
        up: String,
    },
    /// Every GPU's core has stopped.
    #[error("every GPU of this daemon has stopped serving")]
    NoneUp,
}

/// A GPU's load as `pairs` counts it: a memory-bound and a compute-bound
/// client share a GPU at little cost to each other (one H200 ran the FMA
/// loop beside the triad at 0.93 of its rate alone: docs/multi-gpu.md), so
/// such a pair counts as one; clients of one class, and clients that
/// declared none, each count as one.
pub fn pair_load(g: &GpuLoad) -> u32 {
    let undeclared = g.clients.saturating_sub(g.memory_bound + g.compute_bound);
    g.memory_bound.max(g.compute_bound) + undeclared
}

/// `g` with one more client of `class`.
fn with_client(g: &GpuLoad, class: Option<ClientClass>) -> GpuLoad {
    let mut g = *g;
    g.clients += 1;
    match class {
        Some(ClientClass::Memory) => g.memory_bound += 1,
        Some(ClientClass::Compute) => g.compute_bound += 1,
        None => {}
    }
    g
}

/// The GPU for a client pinned to `pin` (if any), of class `class` (if it
/// declared one), under `policy`.
pub fn place(
    policy: Placement,
    gpus: &[GpuLoad],
    pin: Option<u32>,
    class: Option<ClientClass>,
) -> Result<usize, PlaceError> {
    let list = |f: &dyn Fn(&GpuLoad) -> bool| {
        let l: Vec<String> = gpus.iter().enumerate().filter(|(_, g)| f(g)).map(|(i, _)| i.to_string()).collect();
        if l.is_empty() {
            "none".to_string()
        } else {
            l.join(", ")
        }
    };
    if let Some(asked) = pin {
        let Some(g) = gpus.get(asked as usize) else {
            return Err(PlaceError::NoSuchGpu { asked, serving: list(&|_| true) });
        };
        if !g.up {
            return Err(PlaceError::Down { asked, up: list(&|g| g.up) });
        }
        return Ok(asked as usize);
    }
    let up = gpus.iter().enumerate().filter(|(_, g)| g.up);
    let best = match policy {
        Placement::LeastLoaded => up.min_by_key(|(i, g)| (g.clients, g.ops, *i)),
        Placement::Memory => up.min_by_key(|(i, g)| (std::cmp::Reverse(g.memory_free), g.clients, *i)),
        // The load after, then whether it rose (0: the client completes a
        // pair), then least-loaded's order. Where no client declared a class
        // the first two are the clients + 1 and 1 everywhere: least-loaded exactly.
        Placement::Pairs => up.min_by_key(|(i, g)| {
            let after = pair_load(&with_client(g, class));
            (after, after - pair_load(g), g.clients, g.ops, *i)
        }),
    };
    best.map(|(i, _)| i).ok_or(PlaceError::NoneUp)
}

/// `g` with one client of `class` fewer.
fn without_client(g: &GpuLoad, class: Option<ClientClass>) -> GpuLoad {
    let mut g = *g;
    g.clients = g.clients.saturating_sub(1);
    match class {
        Some(ClientClass::Memory) => g.memory_bound = g.memory_bound.saturating_sub(1),
        Some(ClientClass::Compute) => g.compute_bound = g.compute_bound.saturating_sub(1),
        None => {}
    }
    g
}

/// With `--rebalance`, where a client of `class` (if it declared one) on
/// GPU `from` should move, if anywhere, while `from` holds two clients or
/// more (a GPU of one never gives it away):
/// * to an up GPU with no client (the one with the most free memory, then
///   the lowest index): the GPU moved to then holds one client, so nothing
///   moves back;
/// * else, for a client that declared its class, to the GPU where the move
///   lowers the two GPUs' summed pair load ([`pair_load`]; the lowest sum,
///   then the lowest larger load of the two, then the lowest index): a
///   memory-bound client leaves a GPU of two memory-bound ones for one
///   where a compute-bound client has no partner. (A move changes each
///   GPU's pair load by at most one, so one that lowers the sum never
///   raises the larger.) Every such move lowers the sum of all GPUs' pair
///   loads, so moves end.
pub fn rebalance_to(gpus: &[GpuLoad], from: usize, class: Option<ClientClass>) -> Option<usize> {
    let here = gpus.get(from)?;
    if here.clients < 2 {
        return None;
    }
    let empty = gpus
        .iter()
        .enumerate()
        .filter(|(i, g)| *i != from && g.up && g.clients == 0)
        .min_by_key(|(i, g)| (std::cmp::Reverse(g.memory_free), *i))
        .map(|(i, _)| i);
    if empty.is_some() || class.is_none() {
        return empty;
    }
    let (here_before, here_after) = (pair_load(here), pair_load(&without_client(here, class)));
    gpus.iter()
        .enumerate()
        .filter(|(i, g)| *i != from && g.up)
        .filter_map(|(i, g)| {
            let (before, after) = (pair_load(g), pair_load(&with_client(g, class)));
            let (sum, max) = (here_after + after, here_after.max(after));
            (sum < here_before + before).then_some((sum, max, i))
        })
        .min()
        .map(|(_, _, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(clients: u32, ops: u32, memory_free: u64) -> GpuLoad {
        GpuLoad { up: true, clients, ops, memory_free, memory_bound: 0, compute_bound: 0 }
    }

    /// Places `classes` in turn on `n` empty GPUs under `policy`: each one's GPU.
    fn in_turn(policy: Placement, n: usize, classes: &[Option<ClientClass>]) -> Vec<usize> {
        let mut gpus = vec![gpu(0, 0, 0); n];
        classes
            .iter()
            .map(|&c| {
                let g = place(policy, &gpus, None, c).unwrap_or(usize::MAX);
                gpus[g] = with_client(&gpus[g], c);
                g
            })
            .collect()
    }

    const M: Option<ClientClass> = Some(ClientClass::Memory);
    const C: Option<ClientClass> = Some(ClientClass::Compute);

    #[test]
    fn pairs_puts_each_memory_bound_client_beside_a_compute_bound_one_in_any_order() {
        // Every order of two of each on two GPUs: each GPU gets one of each.
        for order in [[M, M, C, C], [M, C, M, C], [C, M, M, C], [C, C, M, M], [M, C, C, M], [C, M, C, M]] {
            let gpus = in_turn(Placement::Pairs, 2, &order);
            for g in 0..2 {
                let here: Vec<_> = order.iter().zip(&gpus).filter(|(_, &x)| x == g).map(|(c, _)| *c).collect();
                assert!(here.contains(&M) && here.contains(&C), "order {order:?} placed {gpus:?}");
            }
        }
        // Least-loaded splits the pairs in arrival order: M, C, M, C gives GPU 0 both M.
        assert_eq!(in_turn(Placement::LeastLoaded, 2, &[M, C, M, C]), [0, 1, 0, 1]);
        assert_eq!(in_turn(Placement::Pairs, 2, &[M, C, M, C]), [0, 0, 1, 1]);
    }

    #[test]
    fn pairs_spreads_clients_of_one_class_and_undeclared_ones_as_least_loaded_does() {
        for class in [M, C, None] {
            assert_eq!(in_turn(Placement::Pairs, 2, &[class; 4]), [0, 1, 0, 1], "{class:?}");
            assert_eq!(in_turn(Placement::Pairs, 3, &[class; 5]), [0, 1, 2, 0, 1], "{class:?}");
        }
        // Undeclared clients among loads of every kind: the same GPU as least-loaded.
        let loads = [gpu(2, 5, 0), gpu(2, 3, 0), GpuLoad { memory_bound: 1, ..gpu(1, 9, 0) }];
        assert_eq!(place(Placement::Pairs, &loads, None, None), place(Placement::LeastLoaded, &loads, None, None));
        // A declared client pairs up before it spreads, but not onto a GPU
        // that is loaded more: one M and one C (load 1) beside one C (load 1).
        let loads = [
            GpuLoad { memory_bound: 1, compute_bound: 1, ..gpu(2, 0, 0) },
            GpuLoad { compute_bound: 1, ..gpu(1, 0, 0) },
        ];
        assert_eq!(place(Placement::Pairs, &loads, None, M), Ok(1), "completes GPU 1's pair");
        assert_eq!(place(Placement::Pairs, &loads, None, C), Ok(1), "load 2 either way: fewer clients");
        assert_eq!(pair_load(&loads[0]), 1);
        assert_eq!(pair_load(&GpuLoad { memory_bound: 2, compute_bound: 1, ..gpu(5, 0, 0) }), 4);
    }

    #[test]
    fn least_loaded_takes_fewest_clients_then_fewest_ops_then_lowest_index() {
        let p = Placement::LeastLoaded;
        assert_eq!(place(p, &[gpu(1, 0, 0), gpu(0, 9, 0)], None, None), Ok(1));
        assert_eq!(place(p, &[gpu(1, 5, 0), gpu(1, 2, 0)], None, None), Ok(1));
        assert_eq!(place(p, &[gpu(1, 2, 0), gpu(1, 2, 0)], None, None), Ok(0));
        // Four clients in turn on two GPUs: 0, 1, 0, 1.
        let mut gpus = [gpu(0, 0, 0), gpu(0, 0, 0)];
        let order: Vec<usize> = (0..4)
            .map(|_| {
                let g = place(p, &gpus, None, None).unwrap_or(usize::MAX);
                gpus[g].clients += 1;
                g
            })
            .collect();
        assert_eq!(order, [0, 1, 0, 1]);
    }

    #[test]
    fn memory_takes_most_free_memory_then_fewest_clients() {
        let p = Placement::Memory;
        assert_eq!(place(p, &[gpu(0, 0, 10), gpu(3, 9, 20)], None, None), Ok(1));
        assert_eq!(place(p, &[gpu(2, 0, 20), gpu(1, 0, 20)], None, None), Ok(1));
        assert_eq!(place(p, &[gpu(1, 0, 20), gpu(1, 0, 20)], None, None), Ok(0));
    }

    #[test]
    fn a_pin_is_kept_and_a_bad_one_names_the_gpus_served() {
        let gpus = [gpu(5, 5, 0), gpu(0, 0, 100)];
        assert_eq!(place(Placement::LeastLoaded, &gpus, Some(0), None), Ok(0), "pinned beats least loaded");
        let e = place(Placement::LeastLoaded, &gpus, Some(2), None).err();
        assert_eq!(e, Some(PlaceError::NoSuchGpu { asked: 2, serving: "0, 1".into() }));
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("no GPU 2") && msg.contains("GPU 0, 1"), "{msg}");
    }

    #[test]
    fn a_stopped_gpu_takes_no_one() {
        let gpus = [GpuLoad { up: false, ..gpu(0, 0, 100) }, gpu(4, 4, 1)];
        assert_eq!(place(Placement::LeastLoaded, &gpus, None, None), Ok(1));
        assert_eq!(place(Placement::Memory, &gpus, None, None), Ok(1));
        assert_eq!(place(Placement::Memory, &gpus, Some(0), None), Err(PlaceError::Down { asked: 0, up: "1".into() }));
        let none = [GpuLoad { up: false, ..gpu(0, 0, 0) }];
        assert_eq!(place(Placement::LeastLoaded, &none, None, None), Err(PlaceError::NoneUp));
    }

    #[test]
    fn rebalance_fills_an_empty_gpu_from_one_of_two_or_more_and_never_moves_back() {
        // GPU 1 empty, GPU 0 with two: one of GPU 0's moves there; none from GPU 1.
        assert_eq!(rebalance_to(&[gpu(2, 0, 0), gpu(0, 0, 5)], 0, None), Some(1));
        assert_eq!(rebalance_to(&[gpu(1, 0, 0), gpu(0, 0, 5)], 0, None), None, "a client alone stays");
        assert_eq!(rebalance_to(&[gpu(2, 0, 0), gpu(1, 0, 5)], 0, None), None, "no GPU is empty");
        // After the move: 1 and 1, nothing more moves either way.
        let after = [gpu(1, 0, 0), gpu(1, 0, 5)];
        assert_eq!((rebalance_to(&after, 0, None), rebalance_to(&after, 1, None)), (None, None));
        // Several empty: the most free memory, then the lowest index; never a stopped one, nor beyond the list.
        let gpus = [gpu(3, 0, 0), gpu(0, 0, 5), gpu(0, 0, 9), gpu(0, 0, 9)];
        assert_eq!(rebalance_to(&gpus, 0, None), Some(2));
        let down = [gpu(3, 0, 0), GpuLoad { up: false, ..gpu(0, 0, 9) }];
        assert_eq!(rebalance_to(&down, 0, None), None);
        assert_eq!(rebalance_to(&gpus, 7, None), None);
    }

    #[test]
    fn rebalance_moves_a_declared_client_to_where_it_completes_a_pair_and_the_moves_end() {
        let on = |m: u32, c: u32, u: u32| GpuLoad { memory_bound: m, compute_bound: c, ..gpu(m + c + u, 0, 0) };
        // M, M on GPU 0 and C, C on GPU 1 (least-loaded's arrival-order split): an M moves over.
        let mut gpus = [on(2, 0, 0), on(0, 2, 0)];
        assert_eq!(rebalance_to(&gpus, 0, M), Some(1));
        assert_eq!(rebalance_to(&gpus, 1, C), Some(0));
        assert_eq!(rebalance_to(&gpus, 0, None), None, "an undeclared client only fills an empty GPU");
        // Moved: then a C leaves GPU 1's M, C, C for GPU 0's lone M; then nothing moves.
        gpus = [on(1, 0, 0), on(1, 2, 0)];
        assert_eq!(rebalance_to(&gpus, 0, M), None, "a GPU of one never gives it away");
        assert_eq!(rebalance_to(&gpus, 1, C), Some(0));
        assert_eq!(rebalance_to(&gpus, 1, M), None, "M, C on GPU 0 is no better for an M than M, C, C less one");
        gpus = [on(1, 1, 0), on(1, 1, 0)];
        for (g, class) in [(0, M), (0, C), (1, M), (1, C)] {
            assert_eq!(rebalance_to(&gpus, g, class), None, "paired: stays");
        }
        // M, M, C here (2) and C, C, C there (3): an M there lowers the sum
        // (1 + 3); an undeclared one beside two Ms gains nothing anywhere.
        assert_eq!(rebalance_to(&[on(2, 1, 0), on(0, 3, 0)], 0, M), Some(1));
        assert_eq!(rebalance_to(&[on(2, 0, 1), on(0, 1, 0)], 0, M), Some(1));
        assert_eq!(rebalance_to(&[on(1, 0, 1), on(1, 0, 0)], 0, M), None, "M, U here, M there: no gain");
        // Of several GPUs, the lowest sum after the move.
        assert_eq!(rebalance_to(&[on(3, 0, 0), on(1, 1, 0), on(0, 1, 0)], 0, M), Some(2));
        // An empty GPU still comes first, for declared clients too.
        assert_eq!(rebalance_to(&[on(1, 1, 0), on(0, 0, 0)], 0, M), Some(1));
    }

    #[test]
    fn names_parse_and_print_back() {
        for name in NAMES {
            assert_eq!(name.parse::<Placement>().map(|p| p.to_string()).as_deref(), Ok(name));
        }
        assert_eq!("fastest".parse::<Placement>(), Err(UnknownPlacement("fastest".into())));
    }
}
