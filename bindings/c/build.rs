//! Gives the shared library the soname it is installed under, so programs
//! linked with `-lthrottlegate` record `libthrottlegate.so.0`.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libthrottlegate.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
