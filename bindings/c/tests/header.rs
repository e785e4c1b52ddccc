//! The committed header is exactly what the pinned cbindgen prints for the
//! current sources. Regenerate with
//! `TG_UPDATE_HEADER=1 cargo test -p throttlegate-c --test header`.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_src(dir.join("src/lib.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen could not read the sources")
        .write(&mut generated);
    let path = dir.join("include/throttlegate.h");
    if std::env::var_os("TG_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/throttlegate.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "bindings/c/include/throttlegate.h is stale; regenerate it with \
         TG_UPDATE_HEADER=1 cargo test -p throttlegate-c --test header"
    );
}
