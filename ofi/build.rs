//! Compiles the C shim over libfabric's inline calls when the headers are
//! here, and otherwise sets `cfg(gw_ofi_none)` so the crate still builds
//! and every constructor says how to get a working build.
//!
//! Nothing is linked from libfabric: the shim finds its six exported
//! functions with dlopen at run time, so one binary runs with or without
//! the library installed. `GW_OFI_NO_HEADERS=1` forces the header-less
//! build, to check that it still compiles.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(gw_ofi_none)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=shim/gw_ofi_shim.c");
    // A path that does not exist would make cargo rerun this every build,
    // so watch the header where it is, else the directory that would hold it.
    for watch in [
        "/usr/include/rdma/fabric.h",
        "/usr/include/rdma",
        "/usr/include",
    ] {
        if Path::new(watch).exists() {
            println!("cargo:rerun-if-changed={watch}");
            break;
        }
    }
    println!("cargo:rerun-if-env-changed=GW_OFI_NO_HEADERS");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let forced_off = std::env::var_os("GW_OFI_NO_HEADERS").is_some_and(|v| v == "1");
    let includes = if forced_off { None } else { find_headers() };
    let Some(includes) = includes else {
        println!("cargo:rustc-cfg=gw_ofi_none");
        println!(
            "cargo:warning=gw-ofi: libfabric headers not found (rdma/fabric.h); \
             building without libfabric support: install libfabric-dev and rebuild"
        );
        return;
    };

    let mut build = cc::Build::new();
    build
        .file("shim/gw_ofi_shim.c")
        .warnings(true)
        .extra_warnings(true);
    for dir in &includes {
        build.include(dir);
    }
    build.compile("gw_ofi_shim");
    // dlopen/dlsym live in libc proper since glibc 2.34; older ones need it.
    println!("cargo:rustc-link-lib=dylib=dl");
}

/// The include directories that hold `rdma/fabric.h`: none needed for
/// /usr/include, else what pkg-config says. `None` when neither has it.
fn find_headers() -> Option<Vec<String>> {
    if Path::new("/usr/include/rdma/fabric.h").exists() {
        return Some(Vec::new());
    }
    let ok = Command::new("pkg-config")
        .args(["--exists", "libfabric"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return None;
    }
    let out = Command::new("pkg-config")
        .args(["--cflags-only-I", "libfabric"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let dirs: Vec<String> = text
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("-I").map(str::to_owned))
        .collect();
    for dir in &dirs {
        let header = format!("{dir}/rdma/fabric.h");
        if Path::new(&header).exists() {
            println!("cargo:rerun-if-changed={header}");
        }
    }
    Some(dirs)
}
