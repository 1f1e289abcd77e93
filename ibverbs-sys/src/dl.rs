//! Run-time loading of libibverbs and librdmacm (feature `dlopen`).
//!
//! Each library is opened with `dlopen` once, on the first call that
//! needs it (or [`crate::load`]); each symbol is looked up with `dlsym` on
//! the first call of its wrapper and kept in that wrapper's [`Slot`].
//! Both are atomics: racing threads may both open (the loser's extra
//! reference is dropped with `dlclose`, the library stays loaded by the
//! winner's) or both look up (same address); nothing is ever unloaded, so a
//! stored address stays valid for the life of the process.

use core::ffi::{c_void, CStr};
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::LoadError;

/// A shared library opened on demand.
pub(crate) struct Library {
    pub(crate) error: LoadError,
    file: &'static CStr,
    /// Loaded first (librdmacm needs libibverbs: without this, its failure
    /// would name librdmacm when libibverbs is what is missing).
    needs: Option<&'static Library>,
    /// The `dlopen` handle, null until opened.
    handle: AtomicPtr<c_void>,
}

pub(crate) static LIBIBVERBS: Library = Library {
    error: LoadError {
        library: "libibverbs.so.1",
        package: "libibverbs1",
    },
    file: c"libibverbs.so.1",
    needs: None,
    handle: AtomicPtr::new(ptr::null_mut()),
};

#[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
pub(crate) static LIBRDMACM: Library = Library {
    error: LoadError {
        library: "librdmacm.so.1",
        package: "librdmacm1",
    },
    file: c"librdmacm.so.1",
    needs: Some(&LIBIBVERBS),
    handle: AtomicPtr::new(ptr::null_mut()),
};

impl Library {
    /// The library's handle, opening it on first use. A failure is not
    /// remembered: a later call tries again.
    pub(crate) fn handle(&'static self) -> Result<*mut c_void, LoadError> {
        let h = self.handle.load(Ordering::Acquire);
        if !h.is_null() {
            return Ok(h);
        }
        self.open()
    }

    /// The address of `name` if the library is already open (never opens
    /// it).
    pub(crate) fn loaded_symbol(&'static self, name: &CStr) -> Option<*mut c_void> {
        let h = self.handle.load(Ordering::Acquire);
        if h.is_null() {
            return None;
        }
        // SAFETY: a live handle (never closed) and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    #[cold]
    fn open(&'static self) -> Result<*mut c_void, LoadError> {
        if let Some(dep) = self.needs {
            dep.handle()?;
        }
        // SAFETY: a NUL-terminated file name; the library's initialisers
        // are rdma-core's own (they read the environment and sysfs).
        let h = unsafe { libc::dlopen(self.file.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            return Err(self.error);
        }
        match self
            .handle
            .compare_exchange(ptr::null_mut(), h, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(h),
            Err(winner) => {
                // Another thread opened it first: drop our reference (the
                // same object; the winner's reference keeps it loaded).
                // SAFETY: `h` is a handle dlopen returned to us, unused.
                unsafe { libc::dlclose(h) };
                Ok(winner)
            }
        }
    }
}

/// Marks a symbol looked up and not found (never a valid code address
/// for the wrappers: it is a static byte, not a function).
static MISSING: u8 = 0;

fn missing() -> *mut c_void {
    ptr::addr_of!(MISSING) as *mut c_void
}

/// One wrapper's resolved address: null until looked up, then the
/// symbol's address or [`MISSING`].
pub(crate) struct Slot(AtomicPtr<c_void>);

impl Slot {
    pub(crate) const fn new() -> Slot {
        Slot(AtomicPtr::new(ptr::null_mut()))
    }

    /// The address of `name` in `lib`, or `None` when the library cannot
    /// be opened or lacks the symbol (an older rdma-core).
    #[inline]
    pub(crate) fn get(&self, lib: &'static Library, name: &CStr) -> Option<*mut c_void> {
        let p = self.0.load(Ordering::Acquire);
        if p == missing() {
            None
        } else if !p.is_null() {
            Some(p)
        } else {
            self.resolve(lib, name)
        }
    }

    #[cold]
    fn resolve(&self, lib: &'static Library, name: &CStr) -> Option<*mut c_void> {
        // A missing library is not cached: it may be a transient failure.
        let h = lib.handle().ok()?;
        // SAFETY: a live handle (never closed) and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        self.0
            .store(if p.is_null() { missing() } else { p }, Ordering::Release);
        (!p.is_null()).then_some(p)
    }
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(value: core::ffi::c_int) {
    // SAFETY: `__errno_location` returns this thread's errno, valid for
    // writes for the thread's life.
    unsafe { *libc::__errno_location() = value };
}

#[cfg(test)]
mod tests {
    use super::*;

    static NOWHERE: Library = Library {
        error: LoadError {
            library: "libibverbs-sys-test-none.so.1",
            package: "none",
        },
        file: c"libibverbs-sys-test-none.so.1",
        needs: None,
        handle: AtomicPtr::new(ptr::null_mut()),
    };

    #[test]
    fn a_missing_library_is_its_error_and_is_tried_again() {
        assert_eq!(NOWHERE.handle(), Err(NOWHERE.error));
        let slot = Slot::new();
        assert_eq!(slot.get(&NOWHERE, c"ibv_get_device_list"), None);
        // Not cached as missing: the library may appear later.
        assert!(slot.0.load(Ordering::Acquire).is_null());
        assert!(NOWHERE.handle.load(Ordering::Acquire).is_null());
    }

    #[test]
    fn symbols_resolve_once_and_a_missing_one_is_remembered() {
        LIBIBVERBS
            .handle()
            .expect("libibverbs installed on the build host");
        let slot = Slot::new();
        let p = slot
            .get(&LIBIBVERBS, c"ibv_get_device_list")
            .expect("exported");
        assert_eq!(slot.get(&LIBIBVERBS, c"ibv_get_device_list"), Some(p));
        let none = Slot::new();
        assert_eq!(none.get(&LIBIBVERBS, c"ibv_no_such_verb"), None);
        assert_eq!(none.0.load(Ordering::Acquire), missing());
        assert_eq!(none.get(&LIBIBVERBS, c"ibv_no_such_verb"), None);
    }
}
