//! Fork support and the sysfs identity of the device. A hardware HCA DMAs into pinned pages, so
//! libibverbs has to keep them out of a child's copy-on-write (`ibv_fork_init`,
//! `ibv_dontfork_range`); softhca touches registered memory from its own threads through the
//! process's own mappings, so a fork needs nothing: it answers as libibverbs does on a kernel
//! with copy-on-fork support (`IBV_FORK_UNNEEDED`, the range calls are successful no-ops).
//!
//! What a child does not inherit is the device itself: its engine, CM and other threads stay
//! with the parent, which keeps reading its sockets and rings. So a device, and rdma_cm's
//! state, belong to the process that opened them ([`generation`]): in a child, opening the
//! device opens a new one (on an address of its own, the parent's being the parent's), as a
//! child on Linux opens a context of its own (the parent's objects are not the child's to use,
//! libibverbs' rule; here they are left alone, never freed, since their threads are gone:
//! closing an inherited context or destroying one of its objects returns 0 and touches
//! nothing, `context::left_by_fork`).
//! softhca has no sysfs directory: the device's index is its place in the device list, and
//! `ibv_get_sysfs_path` gives the path libibverbs would look under.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};

use crate::abi::ibv_device;

/// `IBV_FORK_UNNEEDED` of `enum ibv_fork_status`.
const IBV_FORK_UNNEEDED: c_int = 2;

#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// Forks this process is a child of, counted from the first device open: what a device and
/// rdma_cm record when they open, to tell one of this process from one a fork left behind.
static GENERATION: AtomicU32 = AtomicU32::new(0);

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    crate::rdmacm::fork_release();
}

/// Before a fork: rdma_cm's lock is taken, so that the child does not inherit it held by a
/// thread it has not (the CM thread takes it at every turn); released on both sides after.
extern "C" fn before() {
    crate::rdmacm::fork_prepare();
}

extern "C" fn in_parent() {
    crate::rdmacm::fork_release();
}

/// This process's fork generation (see the module docs). The first call installs the fork
/// handler that counts it, which is in place before any device is open.
pub(crate) fn generation() -> u32 {
    static HANDLER: Once = Once::new();
    // SAFETY: registers handlers with no arguments that touch one atomic and rdma_cm's lock.
    HANDLER.call_once(|| unsafe {
        libc::pthread_atfork(Some(before), Some(in_parent), Some(in_child));
    });
    GENERATION.load(Ordering::Relaxed)
}

/// `SYSFS_PATH` from the environment (not when set-uid, as libibverbs), without trailing
/// slashes, else `/sys`; computed once, as libibverbs caches it.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid/geteuid cannot fail.
        let trusted = unsafe { libc::getuid() == libc::geteuid() };
        let env = trusted.then(|| std::env::var_os("SYSFS_PATH")).flatten();
        let path = env.map(|p| {
            let mut b = std::os::unix::ffi::OsStringExt::into_vec(p);
            b.truncate(256); // IBV_SYSFS_PATH_MAX, as strndup there
            b.retain(|&c| c != 0);
            while b.last() == Some(&b'/') {
                b.pop();
            }
            b
        });
        CString::new(path.unwrap_or_else(|| b"/sys".to_vec())).unwrap_or_default()
    })
    .as_ptr()
}

/// The device's index (softhca0 is the only device: 0), or -1 for no device.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    if device.is_null() {
        return -1;
    }
    0
}
