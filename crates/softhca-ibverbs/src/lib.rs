//! softhca behind the libibverbs C ABI: linked by `scripts/build-libibverbs` into a
//! `libibverbs.so.1` that unmodified C programs (ibv_devinfo, ibv_rc_pingpong, …) load with
//! `LD_LIBRARY_PATH`. Each `ibv_*` object is a heap box whose first field is the C structure
//! the program sees, followed by the softhca object behind it; the program's pointer is the
//! box's. Every device is a `UdpDevice` (RoCEv2 over UDP, GID 0 = its IPv4 address), or with
//! `SOFTHCA_LINK=shm` a `ShmDevice` (the same datagrams through shared-memory rings, processes
//! of one host), so two programs on one host, or on two hosts, talk as two RDMA nodes.
//!
//! What a C caller passes is trusted as libibverbs trusts it (pointers, list links, lengths):
//! the `# Safety` of every exported function is libibverbs' contract for it (live objects
//! from this library, readable and writable structures of the declared types). What softhca
//! checks (keys, bounds, states, sizes) it still checks, and its errors come back as the errno
//! values libibverbs uses.

#![allow(clippy::missing_safety_doc)]

pub mod abi;
mod context;
mod cq;
mod device;
mod dm;
mod domain;
mod ece;
mod foreign;
mod fork;
mod gid;
mod marshall;
mod mem;
pub mod modify_mask;
mod qp;
mod rate;
pub mod rdmacm;
mod rsocket;
mod wr;
mod xrcd;

use std::ffi::c_int;

use softhca::VerbsError;

pub use context::Ctx;

/// The errno libibverbs returns for a softhca error.
fn errno_of(e: &VerbsError) -> c_int {
    match e {
        VerbsError::InsufficientResources | VerbsError::QueueFull | VerbsError::CqSizeTooLarge => libc::ENOMEM,
        VerbsError::NotSupported(_) | VerbsError::InvalidServiceType(_) => libc::EOPNOTSUPP,
        VerbsError::CqInUse | VerbsError::InUse(_) => libc::EBUSY,
        _ => libc::EINVAL,
    }
}

/// The errno of a softhca error, also set in `errno` (for the verbs libibverbs makes do both).
fn errno_set(e: &VerbsError) -> c_int {
    let code = errno_of(e);
    set_errno(code);
    code
}

/// How long Destroy QP and the exit handler wait at most for the engine thread to send what
/// was posted. Only an engine thread the scheduler has not run yet meets it: what cannot be
/// sent (a peer gone) does not count as pending (an RC QP waits off the engine's list, a
/// datagram the link cannot send is dropped and counted). 50 ms, the bound before, is within
/// what a loaded 2-core machine can hold a thread back.
const SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Gives the engine thread up to `max` to finish what `pending` says is still to do: Linux's
/// rxe does a user QP's sending in the `ibv_post_send` system call, so that a verb that
/// follows the posts finds them done (see `softhca::Qp::unsent`, `softhca::Context::unsent`).
fn settle(pending: impl Fn() -> bool, max: std::time::Duration) {
    let deadline = std::time::Instant::now() + max;
    while pending() && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// Sets errno (for the verbs that return a pointer or -1).
fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Whether the program made `fd` non-blocking.
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: fcntl on a descriptor; a bad one gives -1.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// Waits until `fd`, a semaphore eventfd counting the events of a completion channel or of a
/// context's asynchronous queue, has one, by the blocking read(2) libibverbs makes of the
/// kernel's descriptor, so that a signal ends the wait as it ends that one: EINTR where the
/// handler was installed without SA_RESTART (qperf's test timer ends its event loops so), a
/// read restarted by the kernel where it was. The count the read takes is put back at once:
/// the event is taken with its count under its queue's lock, and a thread that finds the
/// count taken meanwhile waits for it there for a moment.
fn wait_event(fd: c_int) -> Result<(), c_int> {
    let mut n: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live local from the descriptor.
    if unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) } != 8 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of a live local to the same descriptor.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    Ok(())
}

/// Clears O_NONBLOCK on `fd` (libibverbs' descriptors start out blocking).
fn make_blocking(fd: c_int) {
    // SAFETY: fcntl on a descriptor softhca created for this object.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// The answer of a verb that libibverbs makes a kernel command of (a `write` or `ioctl` on
/// the device's command file): a failure's code, also left in errno as the failed system
/// call leaves it on Linux, where programs `perror` after `ibv_modify_qp` and the like.
fn command(verb: impl FnOnce() -> c_int) -> c_int {
    let r = verb();
    if r > 0 {
        set_errno(r);
    }
    r
}

/// A null pointer after setting errno.
fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// A critical section that spans several C calls, as a provider's spin lock makes
/// `ibv_wr_start` .. `ibv_wr_complete` (ibv_wr_post(3): "a per-QP critical section where no
/// other threads can enter") and `ibv_start_poll` .. `ibv_end_poll` of one CQ: another
/// thread's [`Gate::enter`] waits until the holder leaves. The holder entering again (a
/// program that starts over without ending) does not wait for itself.
#[derive(Default)]
pub(crate) struct Gate {
    /// The `pthread_self` of the thread inside, if any.
    holder: std::sync::Mutex<Option<libc::pthread_t>>,
    free: std::sync::Condvar,
}

impl Gate {
    pub(crate) fn enter(&self) {
        // SAFETY: pthread_self takes nothing and cannot fail.
        let me = unsafe { libc::pthread_self() };
        let mut h = self.holder.lock().unwrap_or_else(|e| e.into_inner());
        while h.is_some_and(|t| t != me) {
            h = self.free.wait(h).unwrap_or_else(|e| e.into_inner());
        }
        *h = Some(me);
    }

    pub(crate) fn leave(&self) {
        if self.holder.lock().unwrap_or_else(|e| e.into_inner()).take().is_some() {
            self.free.notify_one();
        }
    }
}
