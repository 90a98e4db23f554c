//! The mlx5-over-VFIO entry points (`providers/mlx5/mlx5_vfio.c`): a user-space mlx5 driver
//! that talks to a PCI function bound to `vfio-pci`. This library drives no hardware, so it
//! never hands out a VFIO device; [`mlx5dv_get_vfio_device_list`] walks the same lookup the
//! real one walks to find the device, so that a name matching no mlx5 VFIO function fails
//! exactly as there, errno included.

use std::ffi::{c_char, c_int, c_void, CStr};

use libc::{EINVAL, EOPNOTSUPP};

use crate::{fail, set_errno};

/// The PCI functions rdma-core 44's mlx5 provider drives (vendor Mellanox, 0x15b3): its
/// match table's device IDs (Connect-IB, ConnectX-4 to ConnectX-8 and their virtual
/// functions, the BlueField integrated controllers).
const MLX5_PCI_IDS: [u16; 22] = [
    0x1011, 0x1012, 0x1013, 0x1014, 0x1015, 0x1016, 0x1017, 0x1018, 0x1019, 0x101a, 0x101b, 0x101c, 0x101d, 0x101e,
    0x101f, 0x1021, 0x1023, 0xa2d2, 0xa2d3, 0xa2d6, 0xa2dc, 0xa2df,
];
const PCI_VENDOR_MELLANOX: u16 = 0x15b3;
/// `MLX5DV_VFIO_CTX_FLAGS_INIT_LINK_DOWN`, the only flag.
pub const VFIO_FLAGS_ALL: u32 = 1;

/// `struct mlx5dv_vfio_context_attr`.
#[repr(C)]
pub struct VfioContextAttr {
    pub pci_name: *const c_char,
    pub flags: u32,
    pub comp_mask: u64,
}

/// `mlx5dv_get_vfio_device_list` (`providers/mlx5/mlx5_vfio.c`). The real function refuses
/// a non-zero `comp_mask` or an unknown flag with errno `EOPNOTSUPP`, then looks for the VFIO
/// group of the named PCI function: it parses the name as `domain:bus:slot.function`, checks
/// that `/sys/bus/pci/devices/<name>/` exists, that its `vendor` and `device` files name an
/// mlx5 function, that it has an `iommu_group` link, and that `/dev/vfio/<group>` exists. If
/// any step fails it returns NULL without setting errno itself, so errno is what the failing
/// step left: unchanged when the name does not parse or the function is not an mlx5 one
/// (reading those files succeeded), `ENOENT` (from `stat` or `readlink`) when a path is
/// missing. This function takes the same steps with the same calls and returns the same. At
/// the one point where the real one would succeed (an mlx5 function bound to VFIO), it
/// returns NULL with errno `EOPNOTSUPP`: this library cannot drive the device. A NULL `attr`
/// or name (which the real one dereferences) gives `EINVAL`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_get_vfio_device_list(attr: *mut VfioContextAttr) -> *mut *mut c_void {
    if attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a non-NULL attr is a readable mlx5dv_vfio_context_attr (the prototype).
    let attr = unsafe { &*attr };
    if attr.comp_mask != 0 || attr.flags & !VFIO_FLAGS_ALL != 0 {
        return fail(EOPNOTSUPP);
    }
    if attr.pci_name.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a non-NULL pci_name is a NUL-terminated string (the prototype).
    match unsafe { iommu_group(CStr::from_ptr(attr.pci_name)) } {
        Some(_) => fail(EOPNOTSUPP),
        None => std::ptr::null_mut(),
    }
}

/// The VFIO group of `pci_name` if it is an mlx5 function bound to VFIO (the real
/// provider's lookup, step by step; on failure errno is what the failing call left).
///
/// # Safety
/// Only libc calls on local, NUL-terminated buffers.
unsafe fn iommu_group(pci_name: &CStr) -> Option<c_int> {
    let (mut seg, mut bus, mut slot, mut func): (c_int, c_int, c_int, c_int) = (0, 0, 0, 0);
    // SAFETY: four int outputs for four conversions of a NUL-terminated input.
    let n = unsafe {
        libc::sscanf(pci_name.as_ptr(), c"%04x:%02x:%02x.%d".as_ptr(), &mut seg, &mut bus, &mut slot, &mut func)
    };
    if n != 4 {
        return None;
    }
    let mut path = [0 as c_char; 128];
    // SAFETY: snprintf bounded by the buffer's size, four int arguments for four conversions.
    unsafe {
        libc::snprintf(
            path.as_mut_ptr(),
            path.len(),
            c"/sys/bus/pci/devices/%04x:%02x:%02x.%01x/".as_ptr(),
            seg,
            bus,
            slot,
            func,
        )
    };
    // SAFETY: a zeroed stat buffer is valid; the path is NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } < 0 {
        return None;
    }
    // SAFETY: the path is NUL-terminated.
    if !unsafe { is_mlx5_pci(path.as_ptr()) } {
        return None;
    }
    // SAFETY: strncat within the buffer, leaving room for the NUL.
    unsafe {
        let used = libc::strlen(path.as_ptr());
        libc::strncat(path.as_mut_ptr(), c"iommu_group".as_ptr(), path.len() - used - 1);
    }
    let mut link = [0 as c_char; 128];
    // SAFETY: readlink writes at most the length given.
    let len = unsafe { libc::readlink(path.as_ptr(), link.as_mut_ptr(), link.len() - 1) };
    if len <= 0 {
        return None;
    }
    link[len as usize] = 0;
    // SAFETY: NUL-terminated just above.
    let target = unsafe { CStr::from_ptr(link.as_ptr()) }.to_bytes();
    let base = target.rsplit(|&b| b == b'/').next().unwrap_or(target);
    let mut group_name = [0 as c_char; 129];
    for (d, &s) in group_name.iter_mut().zip(base) {
        *d = s as c_char;
    }
    let mut group: c_int = 0;
    // SAFETY: one int output for one conversion of a NUL-terminated input.
    if unsafe { libc::sscanf(group_name.as_ptr(), c"%d".as_ptr(), &mut group) } != 1 {
        return None;
    }
    // SAFETY: as for the first snprintf and stat.
    unsafe { libc::snprintf(path.as_mut_ptr(), path.len(), c"/dev/vfio/%d".as_ptr(), group) };
    // SAFETY: as above.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } < 0 {
        return None;
    }
    Some(group)
}

/// Whether the PCI function at `dir` (with its trailing slash) is one the mlx5 provider
/// drives: its `vendor` and `device` files, read as numbers in C notation, match its table.
///
/// # Safety
/// `dir` is NUL-terminated.
unsafe fn is_mlx5_pci(dir: *const c_char) -> bool {
    // SAFETY: dir is NUL-terminated (caller).
    let Some(vendor) = (unsafe { read_id(dir, c"vendor") }) else { return false };
    // SAFETY: as above.
    let Some(device) = (unsafe { read_id(dir, c"device") }) else { return false };
    vendor == PCI_VENDOR_MELLANOX && MLX5_PCI_IDS.contains(&device)
}

/// The number in `<dir>/<file>`, truncated to 16 bits; None if it cannot be opened or read.
///
/// # Safety
/// `dir` is NUL-terminated.
unsafe fn read_id(dir: *const c_char, file: &CStr) -> Option<u16> {
    let mut path = [0 as c_char; 256];
    // SAFETY: bounded snprintf of two NUL-terminated strings.
    unsafe { libc::snprintf(path.as_mut_ptr(), path.len(), c"%s/%s".as_ptr(), dir, file.as_ptr()) };
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0 as c_char; 129];
    // SAFETY: read into the buffer, leaving its last byte as the terminating NUL.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len() - 1) };
    // SAFETY: fd is ours; a successful close leaves errno alone.
    unsafe { libc::close(fd) };
    if n <= 0 {
        return None;
    }
    // SAFETY: buf is NUL-terminated.
    Some(unsafe { libc::strtoul(buf.as_ptr(), std::ptr::null_mut(), 0) } as u16)
}

/// `mlx5dv_vfio_get_events_fd` (`providers/mlx5/mlx5_vfio.c`): returns the command
/// completion descriptor of the VFIO context the argument is taken to be, with no check; for
/// any other context it reads unrelated memory. No VFIO context can exist here (see
/// [`mlx5dv_get_vfio_device_list`]), so there is no descriptor: -1, with errno `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_vfio_get_events_fd(_ibctx: *mut c_void) -> c_int {
    set_errno(EOPNOTSUPP);
    -1
}

/// `mlx5dv_vfio_process_events` (`providers/mlx5/mlx5_vfio.c`): polls the health of, and
/// processes the events of, the VFIO context the argument is taken to be, with no check, and
/// returns an errno value on failure. No VFIO context can exist here: `EOPNOTSUPP`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_vfio_process_events(_ibctx: *mut c_void) -> c_int {
    EOPNOTSUPP
}
