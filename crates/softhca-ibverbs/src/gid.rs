//! The GID and P_Key table look-ups libibverbs builds over the basic queries
//! (`ibv_query_gid_ex`, `ibv_query_gid_table`, `ibv_get_pkey_index`) and the Ethernet
//! neighbour of a RoCE destination (`ibv_resolve_eth_l2_from_gid`).
//!
//! softhca's port has one GID (index 0, RoCE v2, the device's IP address), bound to the
//! network interface that holds that address: its `ndev_ifindex` is that interface's.

use std::ffi::{c_int, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softhca::link::udp::sys::interface_name;

use crate::abi::{ibv_ah_attr, ibv_context, ibv_gid};
use crate::command;
use crate::context::ctx;
use crate::device::{ibv_query_gid, ibv_query_pkey};

/// `IBV_GID_TYPE_ROCE_V2` (of `enum ibv_gid_type`, not the sysfs one).
const IBV_GID_TYPE_ROCE_V2: u32 = 2;

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// The interface an address of this host sits on: the one that holds it, or the loopback
/// interface for the rest of 127.0.0.0/8 and ::1 (which Linux routes there).
fn interface_of(ip: IpAddr) -> Option<String> {
    interface_name(ip).or_else(|| ip.is_loopback().then(|| "lo".to_string()))
}

fn ifindex(name: &str) -> u32 {
    let Ok(c) = CString::new(name) else { return 0 };
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// The entry of `gid_index` on `port_num`, or the errno the kernel's GID query gives.
///
/// # Safety
/// `context` is an open context.
unsafe fn gid_entry(context: *mut ibv_context, port_num: u32, gid_index: u32) -> Result<ibv_gid_entry, c_int> {
    // SAFETY: as the caller promises.
    let c = unsafe { ctx(context) };
    let port = u8::try_from(port_num).map_err(|_| libc::EINVAL)?;
    let gid = c.ctx.query_gid(port, gid_index).map_err(|_| libc::EINVAL)?;
    if gid.0 == [0; 16] {
        return Err(libc::ENODATA); // an empty slot, as the kernel reports it
    }
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: gid.0 },
        gid_index,
        port_num,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: interface_of(c.shared.dev.addr()).map_or(0, |n| ifindex(&n)),
    })
}

/// What `ibv_query_gid_ex` calls. `entry_size` must hold the whole entry; flags are reserved
/// (EINVAL, as the kernel's GID query answers). A failure is returned and left in errno, as
/// libibverbs leaves the failed ioctl's (`crate::command`).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    command(|| {
        if flags != 0 || context.is_null() || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        // SAFETY: an open context (libibverbs' contract).
        match unsafe { gid_entry(context, port_num, gid_index) } {
            Ok(e) => {
                // SAFETY: the caller passes `entry_size` writable bytes, checked above to hold one.
                unsafe { entry.write_unaligned(e) };
                0
            }
            Err(errno) => errno,
        }
    })
}

/// `ibv_query_gid_table`'s answer to failure `e`: `-e`, with `e` left in errno.
fn table_error(e: c_int) -> isize {
    crate::set_errno(e);
    -(e as isize)
}

/// What `ibv_query_gid_table` calls: every valid entry of every port, `entry_size` apart; the
/// count, or a negative errno, also left in errno (`-EINVAL` when `max_entries` cannot hold
/// them all, or for flags, which are reserved).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if flags != 0 || context.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return table_error(libc::EINVAL);
    }
    // SAFETY: an open context.
    let c = unsafe { ctx(context) };
    let Ok(dev) = c.ctx.query_device() else { return table_error(libc::EIO) };
    let mut valid = Vec::new();
    for port in 1..=u32::from(dev.phys_port_cnt) {
        let len = c.ctx.query_port(port as u8).map_or(0, |p| p.gid_tbl_len);
        // SAFETY: as above.
        valid.extend((0..len).filter_map(|i| unsafe { gid_entry(context, port, i) }.ok()));
    }
    if valid.len() > max_entries || (!valid.is_empty() && entries.is_null()) {
        return table_error(libc::EINVAL);
    }
    for (i, e) in valid.iter().enumerate() {
        // SAFETY: the caller passes `max_entries` slots of `entry_size` bytes; i < max_entries.
        unsafe { entries.cast::<u8>().add(i * entry_size).cast::<ibv_gid_entry>().write_unaligned(*e) };
    }
    valid.len() as isize
}

/// The index of `pkey` (network order) in the port's P_Key table, or the failing query's -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
    let mut i = 0;
    loop {
        let mut found = 0u16;
        // SAFETY: an open context and a writable P_Key.
        let ret = unsafe { ibv_query_pkey(context, port_num, i, &mut found) };
        if ret < 0 {
            return ret;
        }
        if found == pkey {
            return i;
        }
        i += 1;
    }
}

/// The IP address a RoCE GID stands for (the IPv4-mapped form gives IPv4).
fn ip_of_gid(raw: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(raw);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The Ethernet address of `ip` in the kernel's IPv4 neighbour table (`/proc/net/arp`),
/// complete entries only.
fn arp_entry(ip: Ipv4Addr, device: &str) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let complete =
            cols.get(2).is_some_and(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).is_ok_and(|f| f & 2 != 0));
        if cols.len() < 6 || cols[0].parse::<Ipv4Addr>().ok()? != ip || cols[5] != device || !complete {
            return None;
        }
        let mut mac = [0u8; 6];
        let mut parts = cols[3].split(':');
        for b in &mut mac {
            *b = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        Some(mac)
    })
}

/// The destination MAC (and VLAN, 0xffff for none) of a RoCE address vector, as libibverbs
/// resolves it from the kernel's neighbour table: the source GID's interface must exist
/// (else `-EINVAL`); a destination on the loopback interface has the all-zero MAC Linux
/// gives it; an IPv4 destination elsewhere is looked up in the ARP table, and one that is not
/// there (or an IPv6 one off the loopback interface) is `-EHOSTUNREACH`. Unlike libibverbs,
/// softhca does not send a datagram to make the kernel resolve a missing neighbour.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    if context.is_null() || attr.is_null() || eth_mac.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: a readable address vector (libibverbs' contract).
    let a = unsafe { &*attr };
    let mut sgid = ibv_gid { raw: [0; 16] };
    // SAFETY: an open context and a writable GID.
    let err = unsafe { ibv_query_gid(context, a.port_num, c_int::from(a.grh.sgid_index), &mut sgid) };
    if err != 0 {
        return err;
    }
    let Some(device) = interface_of(ip_of_gid(sgid.raw)) else { return -libc::EINVAL };
    let dst = ip_of_gid(a.grh.dgid.raw);
    let on_loopback = device == "lo" || dst.is_loopback() || interface_name(dst).is_some();
    let mac = match dst {
        _ if on_loopback => [0; 6],
        IpAddr::V4(v4) => match arp_entry(v4, &device) {
            Some(mac) => mac,
            None => return -libc::EHOSTUNREACH,
        },
        IpAddr::V6(_) => return -libc::EHOSTUNREACH,
    };
    // SAFETY: the caller passes ETHERNET_LL_SIZE (6) writable bytes and, if not null, a u16.
    unsafe {
        std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6);
        if !vid.is_null() {
            *vid = 0xffff;
        }
    }
    0
}
