//! include/gpumux.h is what cbindgen makes of the C ABI today.

use std::path::Path;

#[test]
fn the_committed_header_matches_the_c_abi() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/ffi.rs"))
        .with_src(dir.join("src/handles.rs"))
        .generate()
        .expect("cbindgen reads the C ABI");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/gpumux.h");
    if std::env::var_os("GPUMUX_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/gpumux.h");
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/gpumux.h differs from the C ABI in src/ffi.rs: regenerate it with \
         `GPUMUX_BLESS=1 cargo test -p gpumux-client --test header` and commit it"
    );
}
