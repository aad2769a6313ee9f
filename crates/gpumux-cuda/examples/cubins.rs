//! Writes the CUBIN of every suite app, native and transformed, for sm_90 into
//! a folder (default `cubins/`), to compare their SASS with
//! `cuobjdump -sass` or `nvdisasm`: `cargo run -p gpumux-cuda --example cubins -- DIR`.
//! Needs libnvrtc only.
fn main() -> anyhow::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "cubins".into());
    std::fs::create_dir_all(&dir)?;
    for (name, src) in gpumux_cuda::suite::all_sources() {
        let t = gpumux_cuda::transform::transform(src)?;
        for (label, s) in [("native", src.to_string()), ("worker", t.source)] {
            let c = gpumux_cuda::nvrtc::compile(name, &s, 90, &[])?;
            let path = format!("{dir}/{name}.{label}.cubin");
            std::fs::write(&path, &c.cubin)?;
            println!("wrote {path} ({} bytes)", c.cubin.len());
        }
    }
    Ok(())
}
