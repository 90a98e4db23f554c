//! What softhca cannot take from outside its own process: objects another process (or a
//! kernel context behind a command descriptor) created, and memory a dma-buf names. Each
//! answers as libibverbs 44 does for a provider without the operation (rxe's answers): NULL
//! with `errno` `EOPNOTSUPP`, and nothing to undo for the unimports. Importing needs the
//! uverbs command descriptor of a kernel device, which softhca has not: a context's `cmd_fd`
//! is an anonymous file of its own, and importing it is EOPNOTSUPP.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context, ibv_mr, ibv_pd};
use crate::fail;

/// The `cmd_fd` of a softhca context (or a duplicate) names a device whose provider cannot
/// import: EOPNOTSUPP. Any other descriptor fails as libibverbs fails it: EINVAL for one that
/// is not a character device, ENODEV for one that is no uverbs device of this host's.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    if crate::device::is_context_cmd_fd(cmd_fd) {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: fstat writes into a local stat buffer; a bad descriptor gives -1.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(cmd_fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return fail(libc::EINVAL);
    }
    fail(libc::ENODEV)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    fail(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    fail(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// Device memory (`struct ibv_dm`) does not exist on softhca; importing it cannot succeed.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut c_void {
    fail(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

/// A dma-buf is memory of another device's driver, which a user-space HCA cannot map.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    fail(libc::EOPNOTSUPP)
}
