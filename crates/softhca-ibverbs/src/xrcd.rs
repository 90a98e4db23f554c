//! XRC domains (`ibv_open_xrcd`, `ibv_close_xrcd`), as the kernel's uverbs keeps them: a
//! domain opened with a file descriptor is the file's, and another open of the same file
//! (by inode) in this process gets the same domain, unless it asks for O_EXCL; one opened
//! with fd -1 is private. Each open is a handle of its own: the XRC SRQs and target QPs made
//! with it hold it (closing it is EBUSY meanwhile), and the domain goes with its last handle.
//! A device here belongs to one process, so a domain is not shared with another process
//! (README).

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use softhca::Xrcd as SoftXrcd;

use crate::abi::*;
use crate::context::ctx;
use crate::{command, errno_of, fail};

/// One domain and the opens that share it.
pub(crate) struct Domain {
    pub(crate) xrcd: SoftXrcd,
    /// The file's (device, inode), for a domain opened with a descriptor, and an O_PATH
    /// descriptor of the file kept with the domain, so that the inode number cannot pass to
    /// another file while the domain is known by it (the kernel holds the inode, `igrab`).
    /// O_PATH: closing it releases none of the program's POSIX locks on the file, which
    /// closing a descriptor of it otherwise does. None where /proc is not there to reopen it.
    inode: Option<(Inode, Option<std::os::fd::OwnedFd>)>,
    /// Handles open on it.
    opens: AtomicU32,
}

/// A file by its device and inode number.
type Inode = (u64, u64);

/// Domains by the file they were opened with (the kernel's per-device `xrcd_tree`).
static BY_INODE: Mutex<Option<HashMap<Inode, Weak<Domain>>>> = Mutex::new(None);

/// An XRC domain as the program holds it: one per `ibv_open_xrcd`.
#[repr(C)]
pub(crate) struct Xrcd {
    ibv: ibv_xrcd,
    pub(crate) domain: Arc<Domain>,
    /// XRC SRQs and target QPs made with this handle and not yet destroyed (the uobject's
    /// use count: `ibv_close_xrcd` is EBUSY meanwhile).
    users: AtomicU32,
}

/// # Safety
/// `x` comes from [`open_xrcd`] and is not closed.
pub(crate) unsafe fn xrcd<'a>(x: *mut ibv_xrcd) -> &'a Xrcd {
    // SAFETY: `ibv` is the first field of the repr(C) Xrcd the pointer was made from.
    unsafe { &*(x as *const Xrcd) }
}

impl Xrcd {
    /// An XRC SRQ or target QP is made with this handle.
    pub(crate) fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// One made with it is destroyed.
    pub(crate) fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn context(&self) -> *mut ibv_context {
        self.ibv.context
    }
}

/// `verbs_context.open_xrcd`: libibverbs' checks (an unknown `comp_mask` bit EOPNOTSUPP, the
/// descriptor and flags both required, EINVAL), then the kernel's: a bad descriptor EBADF, a
/// file with no domain and no O_CREAT EAGAIN, one with a domain and O_EXCL EINVAL.
pub(crate) unsafe extern "C" fn open_xrcd(c: *mut ibv_context, attr: *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd {
    if c.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's attributes (verbs.h's contract).
    let a = unsafe { &*attr };
    if a.comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED {
        return fail(libc::EOPNOTSUPP);
    }
    if a.comp_mask & (IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS)
        != IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS
    {
        return fail(libc::EINVAL);
    }
    // SAFETY: a context of this library.
    let cx = unsafe { ctx(c) };
    let inode = if a.fd == -1 {
        None
    } else {
        // SAFETY: fstat writes a stat structure for a descriptor, or fails.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, into a local.
        if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
            return fail(libc::EBADF);
        }
        Some((st.st_dev, st.st_ino))
    };
    let mut table = BY_INODE.lock().unwrap_or_else(|e| e.into_inner());
    let found = inode.and_then(|k| table.get_or_insert_with(HashMap::new).get(&k).and_then(Weak::upgrade));
    let domain = match found {
        Some(_) if a.oflags & libc::O_EXCL != 0 => return fail(libc::EINVAL),
        Some(d) => d,
        None if inode.is_some() && a.oflags & libc::O_CREAT == 0 => return fail(libc::EAGAIN),
        None => {
            let pinned = inode.map(|k| (k, path_of(a.fd)));
            let xrcd = match cx.ctx.open_xrcd() {
                Ok(x) => x,
                Err(e) => return fail(errno_of(&e)),
            };
            let d = Arc::new(Domain { xrcd, inode: pinned, opens: AtomicU32::new(0) });
            if let Some(k) = inode {
                table.get_or_insert_with(HashMap::new).insert(k, Arc::downgrade(&d));
            }
            d
        }
    };
    domain.opens.fetch_add(1, Ordering::AcqRel);
    drop(table);
    Box::into_raw(Box::new(Xrcd { ibv: ibv_xrcd { context: c }, domain, users: AtomicU32::new(0) })).cast()
}

/// An O_PATH descriptor of the file `fd` is open on (see `Domain::inode`).
fn path_of(fd: c_int) -> Option<std::os::fd::OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).ok()?;
    // SAFETY: a NUL-terminated path; open returns a new descriptor or -1.
    let pinned = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    // SAFETY: a descriptor just opened and owned by nobody else.
    (pinned >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(pinned) })
}

/// `verbs_context.close_xrcd`: EBUSY while an XRC SRQ or target QP made with this handle
/// exists; the domain closes with its last handle.
pub(crate) unsafe extern "C" fn close_xrcd(x: *mut ibv_xrcd) -> c_int {
    command(|| {
        if x.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live handle of this library.
        let h = unsafe { xrcd(x) };
        // SAFETY: an object of an open context.
        if unsafe { crate::context::left_by_fork((*x).context) } {
            return 0;
        }
        if h.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        let mut table = BY_INODE.lock().unwrap_or_else(|e| e.into_inner());
        if h.domain.opens.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let (Some((k, _)), Some(t)) = (&h.domain.inode, table.as_mut()) {
                t.remove(k);
            }
            // Its SRQs and target QPs were all made with handles now closed, each after
            // they were gone: nothing holds the domain.
            let _ = h.domain.xrcd.close();
        }
        drop(table);
        // SAFETY: from open_xrcd's Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(x as *mut Xrcd) });
        0
    })
}
