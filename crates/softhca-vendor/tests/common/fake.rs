//! A foreign (non-mlx5, non-EFA) device, context and verbs object built in memory, laid out
//! as rdma-core 44's `verbs.h` lays them out: what a provider other than mlx5 or EFA hands a
//! program. The context is an extended one (a `struct verbs_context` around it) whose
//! `query_port` and `query_device_ex` operations are the test's, the device is the first
//! member of a `struct verbs_device` whose operations are not mlx5's or EFA's, and one
//! object serves as QP, CQ, SRQ, WQ, AH, PD, DM and indirection table (in each of those
//! structures the context is the first member). Everything sits in one zeroed arena with
//! room around each piece, so code that looks beyond a structure (rdma-core's `container_of`
//! arithmetic) reads zeros, not someone else's memory.
#![allow(dead_code)]

use std::ffi::{c_int, c_void};

use softhca_vendor::abi;

/// What the fake `query_port` operation does.
#[derive(Clone, Copy)]
pub enum Port {
    Ethernet,
    InfiniBand,
    /// Fails with `ENODEV`, also left in errno.
    Fails,
}

/// `IBV_LINK_LAYER_INFINIBAND`.
const LINK_LAYER_INFINIBAND: u8 = 1;
pub const FW_VER: &str = "12.34.5678";
pub const DEV_NAME: &str = "uverbs7";

const ARENA: usize = 256 * 1024;
const DEVICE: usize = 16 * 1024;
const OBJECT: usize = 32 * 1024;
const MKEY_ATTR: usize = 40 * 1024;
const DV_OBJ: usize = 44 * 1024;
const DV_OUT: usize = 48 * 1024;
const VCTX: usize = 128 * 1024;
/// `sizeof(struct ibv_device)`: `struct verbs_device`'s `ops` follows it.
const DEVICE_SIZE: usize = 664;

/// Stands in for another provider's `struct verbs_device_ops`.
static OTHER_PROVIDER_OPS: [u64; 16] = [0; 16];

unsafe extern "C" fn port_ethernet(_ctx: *mut c_void, _port: u8, attr: *mut u8, len: usize) -> c_int {
    assert_eq!(len, abi::PORT_ATTR_SIZE);
    // SAFETY: the caller passes a whole ibv_port_attr.
    unsafe { attr.add(abi::PORT_ATTR_LINK_LAYER).write(abi::LINK_LAYER_ETHERNET) };
    0
}

unsafe extern "C" fn port_infiniband(_ctx: *mut c_void, _port: u8, attr: *mut u8, _len: usize) -> c_int {
    // SAFETY: as above.
    unsafe { attr.add(abi::PORT_ATTR_LINK_LAYER).write(LINK_LAYER_INFINIBAND) };
    0
}

unsafe extern "C" fn port_fails(_ctx: *mut c_void, _port: u8, _attr: *mut u8, _len: usize) -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = libc::ENODEV };
    libc::ENODEV
}

unsafe extern "C" fn device_ex(_ctx: *mut c_void, _input: *const c_void, attr: *mut u8, len: usize) -> c_int {
    assert_eq!(len, abi::DEVICE_ATTR_EX_SIZE);
    // SAFETY: the caller passes a whole ibv_device_attr_ex; fw_ver is a char[64].
    unsafe { std::ptr::copy_nonoverlapping(FW_VER.as_ptr(), attr.add(abi::DEVICE_ATTR_FW_VER), FW_VER.len()) };
    0
}

/// The arena, owned through a raw pointer: the code under test reads (and the real library
/// may write) it through the addresses handed out, so no Rust reference to it is kept.
pub struct Fake {
    arena: *mut u64,
}

// SAFETY: the arena is plain memory, owned by the Fake.
unsafe impl Send for Fake {}
// SAFETY: the test threads only read it after construction.
unsafe impl Sync for Fake {}

impl Drop for Fake {
    fn drop(&mut self) {
        // SAFETY: allocated by Box::into_raw of a slice of this length in Fake::new.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.arena, ARENA / 8)) });
    }
}

impl Fake {
    /// A foreign device and context whose port 1 answers as `port` says, and a QP (the
    /// shared object) of type `qp_type`.
    pub fn new(port: Port, qp_type: u32) -> Fake {
        let mut f = Fake { arena: Box::into_raw(vec![0u64; ARENA / 8].into_boxed_slice()).cast::<u64>() };
        let device = f.at(DEVICE) as usize;
        let ctx = f.ctx() as usize;
        let object = f.object() as usize;
        let port_op = match port {
            Port::Ethernet => port_ethernet as *const () as usize,
            Port::InfiniBand => port_infiniband as *const () as usize,
            Port::Fails => port_fails as *const () as usize,
        };
        f.put(DEVICE + DEVICE_SIZE, OTHER_PROVIDER_OPS.as_ptr() as usize);
        f.bytes(DEVICE + abi::DEVICE_DEV_NAME, DEV_NAME.as_bytes());
        f.bytes(DEVICE + 24, DEV_NAME.as_bytes()); // the device's `name`
        f.put(VCTX + abi::VCTX_QUERY_PORT, port_op);
        f.put(VCTX + abi::VCTX_QUERY_DEVICE_EX, device_ex as *const () as usize);
        f.put(VCTX + abi::VCTX_SZ, abi::VCTX_SIZE);
        f.put(VCTX + abi::VCTX_CONTEXT + abi::CONTEXT_DEVICE, device);
        f.put(VCTX + abi::VCTX_CONTEXT + abi::CONTEXT_ABI_COMPAT, abi::VERBS_ABI_IS_EXTENDED);
        f.put(OBJECT, ctx);
        f.bytes(OBJECT + abi::QP_TYPE, &qp_type.to_ne_bytes());
        f.put(MKEY_ATTR, object);
        f.put(MKEY_ATTR + 8, object);
        for i in 0..7 {
            f.put(DV_OBJ + 16 * i, object);
            f.put(DV_OBJ + 16 * i + 8, f.at(DV_OUT) as usize);
        }
        f
    }

    /// The same, but a context that is not extended (`abi_compat` is not
    /// `__VERBS_ABI_IS_EXTENDED`), so `verbs.h` falls back to the exported functions.
    pub fn legacy() -> Fake {
        let mut f = Fake::new(Port::Ethernet, 0);
        f.put(VCTX + abi::VCTX_CONTEXT + abi::CONTEXT_ABI_COMPAT, 0);
        f
    }

    fn at(&self, off: usize) -> *mut c_void {
        assert!(off < ARENA);
        // SAFETY: within the arena.
        unsafe { self.arena.cast::<u8>().add(off).cast() }
    }

    fn put(&mut self, off: usize, v: usize) {
        assert_eq!(off % 8, 0);
        // SAFETY: an aligned word within the arena.
        unsafe { self.at(off).cast::<usize>().write(v) };
    }

    fn bytes(&mut self, off: usize, b: &[u8]) {
        assert!(off + b.len() <= ARENA);
        // SAFETY: within the arena.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.at(off).cast::<u8>(), b.len()) };
    }

    /// The `struct ibv_device *`.
    pub fn device(&self) -> *mut c_void {
        self.at(DEVICE)
    }

    /// The `struct ibv_context *`.
    pub fn ctx(&self) -> *mut c_void {
        self.at(VCTX + abi::VCTX_CONTEXT)
    }

    /// The QP / CQ / SRQ / WQ / AH / PD / DM / indirection table of the context.
    pub fn object(&self) -> *mut c_void {
        self.at(OBJECT)
    }

    /// A `struct mlx5dv_mkey_init_attr` naming the PD (the object).
    pub fn mkey_attr(&self) -> *mut c_void {
        self.at(MKEY_ATTR)
    }

    /// A vendor object of the context as rdma-core lays them out: the mlx5 DevX objects
    /// (context first, type 0), DEKs and crypto logins (their DevX object at offset 0),
    /// scheduling nodes and leaves and mkeys (their DevX object at offset 8) all reach the
    /// foreign context through this one. (The shared object doubles as the DevX object and
    /// as a `struct mlx5dv_flow_matcher`, context first.)
    pub fn vendor_obj(&self) -> *mut c_void {
        self.at(MKEY_ATTR)
    }

    /// A `struct mlx5dv_obj` whose every `in` is the object (and every `out` writable).
    pub fn dv_obj(&self) -> *mut c_void {
        self.at(DV_OBJ)
    }
}

pub fn errno() -> c_int {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Errno before each call of the tests: a value no function sets, so that "errno left
/// alone" is visible.
pub const UNTOUCHED: c_int = 12345;
