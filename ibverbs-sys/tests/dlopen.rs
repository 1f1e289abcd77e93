//! Feature `dlopen` on the build host (which has rdma-core, the headers'
//! own): the library loads, every symbol a wrapper was generated for is
//! exported by it (a misspelt or misattributed symbol would fail alone at
//! run time, here it fails the build host's tests), and the wrappers call
//! the library.
#![cfg(feature = "dlopen")]

use std::ffi::{CStr, CString};

fn handle(file: &CStr) -> *mut libc::c_void {
    // SAFETY: a NUL-terminated name; loading rdma-core runs its own
    // initialisers only.
    let h = unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null(), "{file:?} is not loaded");
    h
}

#[test]
fn every_wrapped_symbol_is_exported_by_the_installed_library() {
    rdma_verbs_sys::load().expect("libibverbs");
    let verbs = handle(c"libibverbs.so.1");
    #[cfg(feature = "rdmacm")]
    rdma_verbs_sys::load_rdmacm().expect("librdmacm");
    #[cfg(feature = "rdmacm")]
    let cm = handle(c"librdmacm.so.1");
    assert!(rdma_verbs_sys::DLOPEN_SYMBOLS.len() > 50);
    let mut missing = Vec::new();
    for name in rdma_verbs_sys::DLOPEN_SYMBOLS {
        let h = if name.starts_with("rdma") {
            #[cfg(feature = "rdmacm")]
            {
                cm
            }
            #[cfg(not(feature = "rdmacm"))]
            panic!("{name} without the rdmacm feature")
        } else {
            verbs
        };
        let c = CString::new(*name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        if unsafe { libc::dlsym(h, c.as_ptr()) }.is_null() {
            missing.push(*name);
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
}

#[test]
fn wrappers_call_the_library() {
    // SAFETY: any status value; the library returns a static string.
    let s = unsafe {
        CStr::from_ptr(rdma_verbs_sys::ibv_wc_status_str(
            rdma_verbs_sys::IBV_WC_SUCCESS,
        ))
    };
    assert_eq!(s.to_str().unwrap(), "success");
    // SAFETY: a pure conversion.
    assert_eq!(
        unsafe { rdma_verbs_sys::ibv_rate_to_mult(rdma_verbs_sys::IBV_RATE_10_GBPS) },
        4
    );
}

/// Nothing of rdma-core is linked: this test executable, which calls
/// exported and inline verbs, needs neither library (`readelf -d`).
#[test]
fn nothing_of_rdma_core_is_linked() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("readelf -d {exe:?}: {e}"));
    assert!(out.status.success(), "readelf -d {exe:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(NEEDED)"), "{text}");
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(
        !needed
            .iter()
            .any(|l| l.contains("libibverbs") || l.contains("librdmacm")),
        "{needed:?}"
    );
}
