//! Prints NVRTC/ptxas resource use of every suite kernel, native and transformed
//! (registers, spills): `cargo run -p gpumux-cuda --example regs`. Needs libnvrtc.
fn main() -> anyhow::Result<()> {
    for (name, src) in gpumux_cuda::suite::all_sources() {
        let t = gpumux_cuda::transform::transform(src)?;
        for (label, s) in [("native", src.to_string()), ("worker", t.source)] {
            let log = gpumux_cuda::nvrtc::compile_log(name, &s, 90)?;
            for line in
                log.lines().filter(|l| l.contains("registers") || l.contains("spill") || l.contains("Compiling entry"))
            {
                println!("{name:<10} {label:<7} {}", line.trim());
            }
        }
    }
    Ok(())
}
