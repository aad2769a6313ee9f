//! The command line the vector_add and histogram example clients share:
//! `[--socket PATH] [--out FILE] [--check] [--size N] [--repeat N]`.

use std::path::PathBuf;

/// What the command line asked for.
pub struct ClientArgs {
    /// The daemon's socket (`None`: the default path).
    pub socket: Option<PathBuf>,
    /// Where to write the output.
    pub out: Option<PathBuf>,
    /// Check the output against the CPU.
    pub check: bool,
    /// The input's size, in the example's units.
    pub n: usize,
    /// The kernel's launches, each computing the same output, so `--check` holds for any count.
    pub repeat: u32,
}

impl ClientArgs {
    /// Parses the process's arguments; `n` is the default size.
    pub fn parse(n: usize) -> Result<ClientArgs, String> {
        let mut a = ClientArgs { socket: None, out: None, check: false, n, repeat: 1 };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--socket" => a.socket = Some(PathBuf::from(args.next().ok_or("--socket needs a path")?)),
                "--out" => a.out = Some(PathBuf::from(args.next().ok_or("--out needs a file")?)),
                "--check" => a.check = true,
                "--size" => {
                    a.n = args
                        .next()
                        .and_then(|v| v.parse().ok())
                        .filter(|&v| v > 0 && v < 1 << 30)
                        .ok_or("--size needs a count of 1 to 2^30 - 1")?
                }
                "--repeat" => {
                    a.repeat = args
                        .next()
                        .and_then(|v| v.parse().ok())
                        .filter(|&v| v > 0)
                        .ok_or("--repeat needs a count above 0")?
                }
                other => {
                    return Err(format!(
                        "unknown argument {other:?} (--socket PATH, --out FILE, --check, --size N, --repeat N)"
                    ))
                }
            }
        }
        Ok(a)
    }
}
