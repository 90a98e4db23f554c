//! The two vendor libraries that sit beside softhca's drop-in `libibverbs.so.1`:
//! `libmlx5.so.1` (the `mlx5dv_*` direct-verbs API of NVIDIA/Mellanox ConnectX adapters) and
//! `libefa.so.1` (the `efadv_*` API of AWS EFA), both linked from this crate's static library
//! by `scripts/build-libibverbs` with the version scripts `libmlx5.map` and `libefa.map`.
//!
//! Why they exist: Debian's perftest binaries (`ib_write_bw`, `ib_send_lat`, …) and the
//! python3-pyverbs extension modules name both libraries in `DT_NEEDED` and are linked
//! BIND_NOW, so the loader must resolve every `mlx5dv_*` and `efadv_*` symbol they import
//! before `main` runs. The real libraries (rdma-core's providers) cannot load on the drop-in:
//! they import rdma-core's private provider interface (`ibv_cmd_*`, `verbs_*`, version
//! `IBVERBS_PRIVATE_34`), which the drop-in does not have. These stand in for them.
//!
//! What they do: nothing here talks to hardware, opens a device file or issues a kernel
//! command. Every device a program can reach through the drop-in is a softhca device, which
//! is neither an mlx5 nor an EFA device, so each function gives the answer rdma-core 44's own
//! function gives for a device, context or object that is not its provider's, as read in
//! `providers/mlx5/*.c` and `providers/efa/*.c` at tag `v44.0` (Debian's 44.0). Each
//! function's documentation names the source file and describes the logic that produces the
//! answer; `tests/against_rdma_core.rs` loads the real libraries, where they are installed,
//! and compares the answers call by call on the same foreign objects. The recurring cases:
//!
//! - Most `mlx5dv_*` entry points look up the mlx5 operations table of the context (or of the
//!   object's context) and, when the device is neither an mlx5 nor an mlx5-over-VFIO device,
//!   fail with `EOPNOTSUPP`: as the return value for the functions returning an `int`, as
//!   errno with NULL for those returning a pointer, silently for the `void` ones. Those
//!   answers do not depend on the arguments, so none is read.
//! - Objects only the vendor library itself creates (DevX objects, UARs, mkeys, …) cannot
//!   exist here, since every function creating one fails; the functions taking them answer as
//!   the real ones do for an object on a foreign context, without reading the pointer.
//! - The software-steering (`mlx5dv_dr_*`) layer is partly device independent, and there the
//!   real library *succeeds* on a foreign device: a domain on any Ethernet port (root-level
//!   only, since the DevX capability query fails), root tables in it, and the actions that
//!   need no device (drop, tag, default miss, VLAN pop and push, a raw-packet QP destination).
//!   [`dr`] keeps those objects, and everything that would need the device fails as the real
//!   code fails.
//! - The EFA entry points check that the device is an EFA device first and fail with
//!   `EOPNOTSUPP`.
//!
//! As in libibverbs, what a C caller passes is trusted to be what the prototype says (a live
//! context, readable attribute structures); the `# Safety` of every exported function is
//! rdma-core's contract for it. Where the real function would dereference a NULL pointer,
//! these return the failure instead of crashing.

#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod dr;
pub mod efa;
pub mod mlx5;
pub mod vfio;

use std::ffi::c_int;

/// Sets the calling thread's errno.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// A NULL pointer after setting errno: how rdma-core's pointer-returning functions fail.
pub(crate) fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}
