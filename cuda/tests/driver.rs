//! Without an NVIDIA driver, loading it is an error that says so, with the
//! loader's reason — never a panic — so that `auto` choices and GPU calls
//! can report it.

use gw_cuda::{Driver, Error};

#[test]
fn a_missing_driver_is_named_with_the_loaders_reason() {
    match Driver::load_from("libgw-nosuch-cuda.so.1") {
        Err(e @ Error::DriverNotFound { .. }) => {
            let m = e.to_string();
            assert!(
                m.starts_with("CUDA driver not found (libgw-nosuch-cuda.so.1: "),
                "{m}"
            );
            assert!(m.contains("No such file"), "{m}");
        }
        other => panic!("gave {other:?}"),
    }
}

#[test]
fn the_real_driver_loads_or_says_why_not() {
    // On this project's CI there is no GPU: the error. On a GPU machine
    // (GW_TEST_CUDA=1) it must load.
    match Driver::load() {
        Ok(d) => assert!(d.version() >= 12000, "CUDA {}", d.version()),
        Err(e) => {
            assert!(
                std::env::var("GW_TEST_CUDA").as_deref() != Ok("1"),
                "GW_TEST_CUDA=1 but {e}"
            );
            assert!(
                matches!(e, Error::DriverNotFound { .. } | Error::Driver { .. }),
                "{e}"
            );
            eprintln!("no CUDA driver here: {e}");
        }
    }
}
