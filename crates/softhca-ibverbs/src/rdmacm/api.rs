//! librdmacm's functions, as `softhca_rdma_*` (the `rdma_*` names are `librdmacm.so.1`'s,
//! which forwards to these). Errors follow librdmacm: -1 with errno (NULL with errno for the
//! functions that return a pointer). This file: event channels and events, ids (create,
//! destroy, bind, resolve, listen), options, ports, devices, multicast and ECE; `conn.rs`
//! connects and disconnects, `qp.rs` makes an id's QP, SRQ and endpoint (and
//! `rdma_get_request`, which makes the new id's QP), `addrinfo.rs` is `rdma_getaddrinfo`;
//! the helpers they share (errno, the program's pointers, a request's refusal) are in
//! `mod.rs`.

use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ptr::null_mut;

use super::abi::*;
use super::*;
use crate::abi::*;

#[no_mangle]
pub extern "C" fn softhca_rdma_create_event_channel() -> *mut rdma_event_channel {
    match Channel::new() {
        // SAFETY: a channel just made.
        Ok(c) => unsafe { &mut (*c).c },
        Err(e) => crate::fail(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    // SAFETY: checked against the live channels; a stale or stray pointer is ignored.
    if unsafe { channel_of(channel) }.is_some() {
        // A synchronous id's own channel (`id->channel` of an id made without one) goes with
        // that id: freed here too, rdma_destroy_id freed it again (librdmacm's double free).
        let g = global();
        // SAFETY: registered ids are live (under the lock).
        if g.ids.values().any(|&p| unsafe { &*p }.own == channel as *mut Channel) {
            return;
        }
        drop(g);
        // Out of the live set before its ids are let go (`Channel::free` below repeats it).
        super::set_live(channel as *const Channel, super::Kind::Channel, false);
        // Ids still on it (the program should have destroyed them first) go as the kernel's
        // go with a closed rdma_cm descriptor (`ucma_close`): their ports and listens are
        // freed, their connections ended (a DREQ or REJ to the peer), and they get no more
        // events; the program's structures stay, failed, for rdma_destroy_id. Nothing writes
        // to the freed channel.
        let mut g = global();
        // The connection requests queued on it that the program never took: their ids were
        // never handed out, and nothing could reach them after (librdmacm's go with the
        // kernel's contexts). Each is refused and freed.
        // SAFETY: the channel is live until `Channel::free` below.
        let queued: Vec<_> =
            unsafe { &*(channel as *mut Channel) }.q.lock().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        for ev in queued.iter().filter(|ev| ev.listen_serial != 0) {
            if let Some(id) = g.id(ev.id_serial) {
                release(&mut g, id);
                super::destroy_unannounced(&mut g, id);
            }
        }
        let on: Vec<*mut Id> = g.ids.values().copied().collect();
        for p in on {
            // SAFETY: registered ids are live (under the lock).
            let id = unsafe { &mut *p };
            if id.c.channel == channel {
                release(&mut g, id);
                id.st.phase = Phase::Failed;
                id.c.channel = null_mut();
            }
        }
        drop(settle(g, std::time::Duration::from_millis(200)));
        // SAFETY: a channel of this library that the program gives up.
        unsafe { Channel::free(channel as *mut Channel) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    let qp_type = match ps {
        RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
        RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
        _ => return err(libc::EINVAL),
    };
    // SAFETY: the program's arguments.
    unsafe { create_id(channel, id, context, ps, qp_type) }
}

/// librdmacm's `rdma_create_id2`: an id of `ps` for QPs of `qp_type`.
pub(super) unsafe fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> c_int {
    if id.is_null() || !matches!(ps, RDMA_PS_TCP | RDMA_PS_IB | RDMA_PS_UDP | RDMA_PS_IPOIB) {
        return err(libc::EINVAL);
    }
    let (channel, own) = if channel.is_null() {
        match Channel::new() {
            // SAFETY: a channel just made.
            Ok(c) => (unsafe { &mut (*c).c as *mut rdma_event_channel }, c),
            Err(e) => return err(e),
        }
    } else {
        // SAFETY: checked against the live channels; a stale or stray one is EINVAL.
        if unsafe { channel_of(channel) }.is_none() {
            return err(libc::EINVAL);
        }
        (channel, null_mut())
    };
    // An id holds a QP, CQs and channels from here: the CM must hear of a program's destroy
    // of one of them (ibv_destroy_qp, ibv_destroy_cq, ibv_destroy_comp_channel).
    crate::qp::on_destroy(super::forget_qp);
    crate::cq::on_destroy(super::forget_cq);
    // The fork handlers, before any thread of the CM's can hold its lock.
    crate::fork::generation();
    let mut g = global();
    match new_id(&mut g, channel, context, ps, qp_type) {
        Ok(new) => {
            new.sync = !own.is_null();
            new.own = own;
            // SAFETY: the program's out pointer.
            unsafe { *id = &mut new.c };
            0
        }
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    {
        let mut g = global();
        g.ids.remove(&id.serial);
        release(&mut g, id);
        // Its DREQ (or REJ) leaves before the program can exit (see `settle`).
        drop(settle(g, std::time::Duration::from_millis(200)));
    }
    if id.sync && !id.c.event.is_null() {
        // SAFETY: the event this synchronous id kept from its last call.
        unsafe { softhca_rdma_ack_cm_event(id.c.event) };
    }
    // Events the program took and has not acknowledged yet point at the id.
    let mut a = id.acks.lock().unwrap_or_else(|e| e.into_inner());
    while a.1 < a.0 {
        a = id.acked.wait(a).unwrap_or_else(|e| e.into_inner());
    }
    drop(a);
    if !id.own.is_null() {
        // SAFETY: the id's own channel, which nobody else holds.
        unsafe { Channel::free(id.own) };
    }
    // Live until here: acknowledging the events above goes through it.
    super::set_live(id as *const Id, super::Kind::Id, false);
    // SAFETY: out of the registry, so nothing else reaches it.
    drop(unsafe { Box::from_raw(id as *mut Id) });
    0
}

/// What the kernel's rdma_cm gives up with an id (`rdma_destroy_id`, or the closing of the
/// descriptor its channel is): its port, its listen and its connection (the CM sends a DREQ
/// or a REJ). Done once: the port is forgotten after.
fn release(g: &mut Global, id: &mut Id) {
    // An id a request made carries its listener's port without owning it: only the port's
    // owners give up its reservation, the last of them (a new owner may hold it by now).
    // An id binds once, so the port it carries is the only one it can own or listen on.
    let sid = service_id(id.c.ps, id.st.port);
    let (owned, last_owner) = leave(&mut g.ports, (id.c.ps, id.st.port), id.serial);
    let (_, last_listener) = leave(&mut g.listeners, sid, id.serial);
    if let Some(d) = g.dev.as_mut() {
        if id.st.phase == Phase::Listen && last_listener {
            d.agent.cm().unlisten(sid);
        }
        if owned && last_owner {
            d.agent.cm().unreserve(sid);
            d.agent.transmit();
        }
        if let Some(comm) = id.st.comm.take() {
            d.agent.cm().destroy(comm);
            d.agent.transmit();
        }
    }
    id.st.port = 0;
    g.conns.retain(|_, s| *s != id.serial);
}

/// Takes `serial` out of `map`'s list at `key` (the list goes when it empties): whether it was
/// there, and whether the list is gone now.
fn leave<K: Ord>(map: &mut BTreeMap<K, Vec<u64>>, key: K, serial: u64) -> (bool, bool) {
    let Some(list) = map.get_mut(&key) else { return (false, true) };
    let was = list.contains(&serial);
    list.retain(|s| *s != serial);
    let gone = list.is_empty();
    if gone {
        map.remove(&key);
    }
    (was, gone)
}

/// Binds `id` to `addr`: the device, if it is on that address (see below for where a device
/// not yet open goes), and a port. A refused bind leaves the id as it was.
pub(super) fn bind(g: &mut Global, id: &mut Id, addr: SocketAddr) -> Result<(), c_int> {
    if id.st.phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    let ip = addr.ip();
    let mut dev = None;
    if ip.is_unspecified() {
        // The id stays on no device, as on Linux; but the process's device takes its address
        // now, before the program can hand the port to a peer. A server that binds the any
        // address and sends its port before it listens (qperf 0.4.11's `-cm1` tests) would
        // otherwise leave 127.0.0.1 free for the client it told, whose connect then reached
        // the client's own device (rejected: no listener there). A device that cannot open
        // fails the listen or the resolve, as it did.
        let _ = g.open(None);
    } else {
        // A device not yet open goes where the user put it (SOFTHCA_ADDR), else on a bound
        // loopback address (`rping -s -a 127.0.0.5` needs no more), else where devices go by
        // default: a program that probes this host's interfaces by binding their addresses
        // (libfabric's verbs provider does) must not move it there, nor two processes race
        // for one interface address.
        let user = std::env::var_os(softhca::link::ADDR_VAR).is_some();
        let place = (!user && ip.is_loopback()).then_some(ip);
        match g.open(place) {
            Ok(d) if d.addr == ip => dev = Some((d.ctx, d.pd, d.gid)),
            // A loopback address that is not the device's binds as the any address does, with
            // no device (`verbs` NULL): Linux's rdma_cm binds an address of `lo` so (no RDMA
            // device is on it), and libfabric's verbs provider binds "localhost" to probe.
            _ if ip.is_loopback() => {}
            Ok(_) => return Err(if is_local(ip) { libc::ENODEV } else { libc::EADDRNOTAVAIL }),
            Err(_) if !is_local(ip) => return Err(libc::EADDRNOTAVAIL),
            Err(e) => return Err(e),
        }
    }
    let port = g.take_port(id.c.ps, addr, id.serial, id.st.reuseaddr, id.afonly(addr))?;
    if let Some(d) = g.dev.as_mut() {
        // A REQ that beats the listen waits for it (see `Cm::reserve`).
        d.agent.cm().reserve(service_id(id.c.ps, port));
    }
    if let Some((ctx, pd, gid)) = dev {
        id.c.verbs = ctx;
        id.c.pd = pd;
        id.c.port_num = 1;
        id.c.route.addr.ibaddr.sgid = ibv_gid { raw: gid };
        id.c.route.addr.ibaddr.pkey = 0xFFFF;
    }
    id.st.port = port;
    write_sa(&mut id.c.route.addr.src, SocketAddr::new(ip, port));
    id.st.phase = Phase::AddrBound;
    Ok(())
}

/// Whether `ip` is an address of this host (a UDP socket can bind it).
pub(super) fn is_local(ip: IpAddr) -> bool {
    softhca::link::udp::sys::udp_bind(SocketAddr::new(ip, 0)).is_ok()
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the program's id and address.
    let (id, a) = match (unsafe { id_of(p) }, unsafe { read_sa(addr) }) {
        (Ok(id), Some(a)) => (id, a),
        (Err(e), _) => return err(e),
        // librdmacm: an address of no family it knows has no length (`ucma_addrlen`).
        (_, None) => return err(libc::EINVAL),
    };
    let mut g = global();
    result(bind(&mut g, id, a))
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the program's id and addresses.
    let (id, src, dst) = match (unsafe { id_of(p) }, unsafe { read_sa(src) }, unsafe { read_sa(dst) }) {
        (Err(e), ..) => return err(e),
        // A source given in a family librdmacm does not know is EINVAL, as no destination is.
        (_, None, _) if !src.is_null() => return err(libc::EINVAL),
        (Ok(id), s, Some(d)) => (id, s, d),
        (_, _, None) => return err(libc::EINVAL),
    };
    {
        let mut g = global();
        if id.st.phase == Phase::Idle {
            let any = match dst {
                SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            };
            if let Err(e) = bind(&mut g, id, src.unwrap_or(SocketAddr::new(any, 0))) {
                return err(e);
            }
        }
        if id.st.phase != Phase::AddrBound {
            return err(libc::EINVAL);
        }
        let dev = match g.open(None) {
            Ok(d) => d,
            Err(e) => return err(e),
        };
        let (ctx, pd, gid, addr, mtu) = (dev.ctx, dev.pd, dev.gid, dev.addr, dev.active_mtu);
        let mut dst = dst;
        if dst.ip().is_unspecified() {
            dst.set_ip(addr); // the kernel resolves the any address to this host
        }
        // The kernel's route from the device's address to the destination. As Linux's
        // rdma_resolve_ip, a route lookup that fails fails the call (ENETUNREACH for no
        // route; the id stays bound); ADDR_ERROR is for what fails later, which over UDP
        // (no neighbour to wait for) nothing does.
        let reach = softhca::link::udp::sys::udp_bind(SocketAddr::new(addr, 0))
            .and_then(|s| s.connect(SocketAddr::new(dst.ip(), 4791)));
        if let Err(e) = reach {
            return err(e.raw_os_error().unwrap_or(libc::ENETUNREACH));
        }
        id.c.verbs = ctx;
        if id.c.pd.is_null() {
            id.c.pd = pd;
        }
        id.c.port_num = 1;
        write_sa(&mut id.c.route.addr.src, SocketAddr::new(addr, id.st.port));
        write_sa(&mut id.c.route.addr.dst, dst);
        id.c.route.addr.ibaddr =
            rdma_ib_addr { sgid: ibv_gid { raw: gid }, dgid: ibv_gid { raw: gid_of(dst.ip()) }, pkey: 0xFFFF };
        id.path.mtu = mtu;
        id.st.phase = Phase::AddrResolved;
        id.queue(Event::new(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
    }
    result(complete(id))
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_resolve_route(p: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    {
        let _g = global();
        if id.st.phase != Phase::AddrResolved {
            return err(libc::EINVAL);
        }
        let mtu = id.path.mtu;
        let flow_label = id.src_addr().zip(id.dst_addr()).map_or(0, |(s, d)| roce_flow_label(s, d));
        fill_path(id, mtu, flow_label);
        id.st.phase = Phase::RouteResolved;
        id.queue(Event::new(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    }
    result(complete(id))
}

/// For a synchronous id: waits for the event its call started (librdmacm's `ucma_complete`),
/// keeps it in `id->event`, and turns a failed one into errno.
pub(super) fn complete(id: &mut Id) -> Result<(), c_int> {
    if !id.sync {
        return Ok(());
    }
    if !id.c.event.is_null() {
        // SAFETY: the event kept from the id's last call.
        unsafe { softhca_rdma_ack_cm_event(id.c.event) };
        id.c.event = null_mut();
    }
    let mut ev = null_mut();
    // SAFETY: the id's own channel; a local out pointer.
    if unsafe { softhca_rdma_get_cm_event(id.c.channel, &mut ev) } != 0 {
        // SAFETY: errno of this thread, just set.
        return Err(unsafe { *libc::__errno_location() });
    }
    id.c.event = ev;
    // SAFETY: the event just taken.
    let e = unsafe { &*ev };
    match e.status {
        0 => Ok(()),
        _ if e.event == RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

/// librdmacm's `ucma_complete` for the rsocket layer: a synchronous id takes the event its
/// last call started (EAGAIN while it has not come, on a non-blocking channel).
///
/// # Safety
/// `p` is an id of this library, not destroyed meanwhile.
pub(crate) unsafe fn complete_id(p: *mut rdma_cm_id) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    complete(unsafe { id_of(p) }?)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_listen(p: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let mut g = global();
    if id.st.phase == Phase::Idle {
        if let Err(e) = bind(&mut g, id, SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)) {
            return err(e);
        }
    }
    if id.st.phase != Phase::AddrBound {
        return err(libc::EINVAL);
    }
    // A port shared by reuse is checked again without it (Linux's rdma_listen): a listener
    // has it to itself on its address.
    if id.st.reuseaddr {
        if let (Some(owners), Some(a)) = (g.ports.get(&(id.c.ps, id.st.port)), id.src_addr()) {
            if let Err(e) = g.check_port(owners, id.serial, a, false, id.afonly(a)) {
                return err(e);
            }
        }
        id.st.reuseaddr = false;
    }
    let sid = service_id(id.c.ps, id.st.port);
    let dev = match g.open(None) {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    dev.agent.cm().listen(sid);
    g.listeners.entry(sid).or_default().push(id.serial);
    id.st.phase = Phase::Listen;
    // REQs held for the listen are connection requests now: the CM thread hands them out.
    super::wake();
    debug(|| format!("id {}: listening on port {} (service ID {sid:#018x})", id.serial, id.st.port));
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    // SAFETY: the program's channel.
    let Some(ch) = (unsafe { channel_of(channel) }) else { return err(libc::EINVAL) };
    if event.is_null() {
        return err(libc::EINVAL);
    }
    loop {
        let ev = match ch.take() {
            Ok(ev) => ev,
            Err(e) => return err(e),
        };
        let g = global();
        let Some(id) = g.id(ev.id_serial) else { continue }; // its id was destroyed
        let counted = if ev.listen_serial != 0 {
            match g.id(ev.listen_serial) {
                Some(l) => l,
                None => {
                    // The listener went first: its request is refused.
                    drop(g);
                    // SAFETY: the request's id, live until destroyed here.
                    unsafe {
                        reject(&mut id.c, std::ptr::null(), 0, REJ_CONSUMER);
                        softhca_rdma_destroy_id(&mut id.c);
                    }
                    continue;
                }
            }
        } else {
            id
        };
        counted.acks.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
        let handed = &mut Box::leak(ev).c;
        super::set_live(handed as *const rdma_cm_event, super::Kind::Event, true);
        // SAFETY: the program's out pointer; the event is the program's until it acks it.
        unsafe { *event = handed };
        return 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    // Only an event handed out and not yet acknowledged: a second ack, or a stray pointer, is
    // EINVAL (librdmacm frees it again).
    if event.is_null() || !super::take_live(event as *const rdma_cm_event, super::Kind::Event) {
        return err(libc::EINVAL);
    }
    // SAFETY: an event this library handed out; its `c` is the first field of an `Event`.
    let ev = unsafe { Box::from_raw(event as *mut Event) };
    let counted = if ev.c.listen_id.is_null() { ev.c.id } else { ev.c.listen_id };
    // SAFETY: an id with an unacknowledged event is not freed (destroy waits for the ack).
    if let Ok(id) = unsafe { id_of(counted) } {
        id.acks.lock().unwrap_or_else(|e| e.into_inner()).1 += 1;
        id.acked.notify_all();
    }
    0
}

#[no_mangle]
pub extern "C" fn softhca_rdma_event_str(event: c_int) -> *const c_char {
    usize::try_from(event).ok().and_then(|i| EVENT_NAMES.get(i)).map_or(c"UNKNOWN EVENT".as_ptr(), |s| s.as_ptr())
}

/// Takes one count from the semaphore eventfd `fd` if it has one, without waiting, whatever
/// the descriptor's blocking mode (the program's to choose): a read with RWF_NOWAIT, which
/// an eventfd takes since Linux 5.12. Where that read is refused, a poll first, then the
/// read; there another thread's read between the two leaves this one waiting for the next
/// count.
fn take_count_now(fd: c_int) -> bool {
    let mut v = 0u64;
    let iov = libc::iovec { iov_base: (&mut v as *mut u64).cast(), iov_len: 8 };
    // SAFETY: one iovec over a local of 8 bytes; offset -1 (the descriptor has none).
    let n = unsafe { libc::preadv2(fd, &iov, 1, -1, libc::RWF_NOWAIT) };
    if n == 8 {
        return true;
    }
    if n == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
        return false; // no count left
    }
    // EOPNOTSUPP (an old kernel), ENOSYS, a seccomp filter's EPERM: the poll and the read.
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, a local; no wait.
    if unsafe { libc::poll(&mut pfd, 1, 0) } != 1 {
        return false;
    }
    // SAFETY: reads 8 bytes into a local; the eventfd is in semaphore mode and was readable.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) == 8 }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_migrate_id(p: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if id.sync && channel.is_null() {
        return err(libc::EINVAL);
    }
    if id.sync && !id.c.event.is_null() {
        // SAFETY: the event this synchronous id kept from its last call.
        unsafe { softhca_rdma_ack_cm_event(id.c.event) };
        id.c.event = null_mut();
    }
    let (to, own) = if channel.is_null() {
        match Channel::new() {
            // SAFETY: a channel just made.
            Ok(c) => (unsafe { &mut (*c).c as *mut rdma_event_channel }, c),
            Err(e) => return err(e),
        }
    } else {
        // SAFETY: checked against the live channels; a stale or stray one is EINVAL.
        if unsafe { channel_of(channel) }.is_none() {
            return err(libc::EINVAL);
        }
        (channel, null_mut())
    };
    let _g = global();
    // Queued events of the id go with it (none when its channel was destroyed under it).
    let mut moved = Vec::new();
    if let Some(from) = id.channel() {
        {
            let mut q = from.q.lock().unwrap_or_else(|e| e.into_inner());
            let mut keep = VecDeque::new();
            while let Some(ev) = q.pop_front() {
                if ev.id_serial == id.serial && ev.listen_serial == 0 {
                    moved.push(ev);
                } else {
                    keep.push_back(ev);
                }
            }
            *q = keep;
        }
        for _ in &moved {
            // A thread in rdma_get_cm_event may have read this event's count already and find
            // the queue empty (it waits for the next): a count no longer there is not waited
            // for, which held the global lock, and every rdma_* call, for ever.
            if !take_count_now(from.efd.as_raw_fd()) {
                break;
            }
        }
    }
    let old_own = std::mem::replace(&mut id.own, own);
    id.c.channel = to;
    id.sync = !own.is_null();
    for ev in moved {
        id.queue(ev);
    }
    if !old_own.is_null() {
        // SAFETY: the id's former own channel, emptied of its events.
        unsafe { Channel::free(old_own) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if optval.is_null() {
        return err(libc::EINVAL);
    }
    let _g = global();
    match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => {
            // SAFETY: one byte, as the length says.
            id.st.tos = unsafe { *(optval as *const u8) };
        }
        // Linux's rdma_set_ack_timeout: RC ids only.
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 && id.c.qp_type == IBV_QPT_RC => {
            // SAFETY: one byte, as the length says.
            id.st.ack_timeout = Some(unsafe { *(optval as *const u8) }.min(31));
        }
        // Linux's rdma_set_reuseaddr: set before the listen, cleared only before the bind.
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if optlen == size_of::<c_int>() => {
            // SAFETY: an int, as the length says.
            let on = unsafe { (optval as *const c_int).read_unaligned() } != 0;
            if !((on && id.st.phase != Phase::Listen) || id.st.phase == Phase::Idle) {
                return err(libc::EINVAL);
            }
            id.st.reuseaddr = on;
        }
        // Linux's rdma_set_afonly: before the address is resolved.
        (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if optlen == size_of::<c_int>() => {
            if !matches!(id.st.phase, Phase::Idle | Phase::AddrBound) {
                return err(libc::EINVAL);
            }
            // SAFETY: an int, as the length says.
            id.st.afonly = Some(unsafe { (optval as *const c_int).read_unaligned() } != 0);
        }
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {}
        (
            RDMA_OPTION_ID,
            RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT | RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY,
        ) => return err(libc::EINVAL),
        _ => return err(libc::ENOSYS),
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_src_port(p: *mut rdma_cm_id) -> u16 {
    // SAFETY: the program's id.
    match unsafe { id_of(p) } {
        // SAFETY: the id's own address storage.
        Ok(id) => id.src_addr().map_or(0, |a| a.port().to_be()),
        Err(_) => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    // SAFETY: the program's id.
    match unsafe { id_of(p) } {
        // SAFETY: the id's own address storage.
        Ok(id) => id.dst_addr().map_or(0, |a| a.port().to_be()),
        Err(_) => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctx = match global().open(None) {
        Ok(d) => d.ctx,
        Err(e) => return crate::fail(e),
    };
    // SAFETY: calloc returns zeroed memory for two pointers, or NULL.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_context>()) } as *mut *mut ibv_context;
    if list.is_null() {
        return crate::fail(libc::ENOMEM);
    }
    // SAFETY: the two slots just allocated; the program's counter if given.
    unsafe {
        *list = ctx;
        if !num.is_null() {
            *num = 1;
        }
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: a list rdma_get_devices allocated (the contexts stay open, as librdmacm's do).
    unsafe { libc::free(list.cast()) };
}

/// `rdma_join_multicast`: a full-member join of the group at `addr` (see [`join`]).
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_join_multicast(
    p: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the program's id and address.
    unsafe { join(p, addr, false, context) }
}

/// `rdma_join_multicast_ex`: librdmacm's checks of the attributes (ENOTSUP for a mask bit it
/// does not know; EINVAL without the address or the flags, or for an unknown flag), then
/// [`join`], send-only or not.
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_join_multicast_ex(
    p: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's attributes, not null.
    let a = unsafe { &*attr };
    if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
        return err(libc::ENOTSUP);
    }
    let needed = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if a.comp_mask & needed != needed || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's id and address.
    unsafe { join(p, a.addr, a.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, context) }
}

/// The kernel's ENOTSUPP (524), its answer to an IPv6 group on a RoCEv2 port.
const ENOTSUPP: c_int = 524;

/// Joins the group at `addr` as rdma_cm does on a RoCEv2 port (`cma_iboe_join_multicast`):
/// an id with a device, bound or with its address resolved (EINVAL otherwise), of a UD port
/// space (UDP, IPoIB); an IPv4 group, whose MGID is `::ffff:a.b.c.d` (an IPv6 one: ENOTSUPP,
/// 524); no exchange with anyone, so the MULTICAST_JOIN event comes at once, its address
/// handle toward the MGID (hop limit 64), QPN 0xFFFFFF, the port space's Q_Key and the
/// program's `context` as private data. No duplicate check: a second join of one address is a
/// second membership. The id's QP is attached as librdmacm attaches it on the event
/// (`ucma_process_join`), unless the join is send-only; if the attach fails the event is
/// MULTICAST_ERROR with status -1.
///
/// # Safety
/// `p` is the program's id pointer (checked), `addr` null or a readable socket address.
unsafe fn join(p: *mut rdma_cm_id, addr: *mut libc::sockaddr, send_only: bool, context: *mut c_void) -> c_int {
    // SAFETY: the program's id and address.
    let (id, addr) = match (unsafe { id_of(p) }, unsafe { read_sa(addr) }) {
        (Ok(id), Some(a)) => (id, a),
        (Err(e), _) => return err(e),
        (_, None) => return err(libc::EINVAL),
    };
    {
        let g = global();
        let bound = matches!(id.st.phase, Phase::AddrBound | Phase::AddrResolved);
        if !bound || id.c.verbs.is_null() || !matches!(id.c.ps, RDMA_PS_UDP | RDMA_PS_IPOIB) {
            return err(libc::EINVAL);
        }
        let mgid = match addr.ip() {
            IpAddr::V4(v4) if !v4.is_unspecified() => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) if !v6.is_unspecified() => return err(ENOTSUPP),
            _ => return err(libc::EINVAL),
        };
        id.st.mcs.push(Mc { addr, mgid, send_only });
        let mut ev = Event::new(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
        // The id's address handle, toward the group: no flow label, traffic class 0.
        let mut ah_attr = g.ah_attr(id);
        ah_attr.grh.dgid = ibv_gid { raw: mgid };
        (ah_attr.grh.flow_label, ah_attr.grh.traffic_class) = (0, 0);
        ev.ud(ah_attr, 0xFF_FFFF, qkey_of(id.c.ps), &[]);
        ev.c.param.ud.private_data = context;
        if !id.c.qp.is_null() && !send_only {
            // SAFETY: the id's live QP and a local GID.
            let r = unsafe { crate::mem::ibv_attach_mcast(id.c.qp, &ibv_gid { raw: mgid }, 0) };
            if r != 0 {
                ev.c.event = RDMA_CM_EVENT_MULTICAST_ERROR;
                ev.c.status = -1;
            }
        }
        id.queue(ev);
    }
    result(complete(id))
}

/// `rdma_leave_multicast`: the membership joined at `addr` (the first, if joined twice) ends,
/// its QP detached (unless the join was send-only; the detach's answer is not looked at, as
/// librdmacm does not); EADDRNOTAVAIL when the id has no membership at that address.
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_leave_multicast(p: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the program's id and address.
    let (id, addr) = match (unsafe { id_of(p) }, unsafe { read_sa(addr) }) {
        (Ok(id), Some(a)) => (id, a),
        (Err(e), _) => return err(e),
        (_, None) => return err(libc::EINVAL),
    };
    let _g = global();
    let Some(at) = id.st.mcs.iter().position(|m| m.addr == addr) else {
        return err(libc::EADDRNOTAVAIL);
    };
    let mc = id.st.mcs.remove(at);
    if !id.c.qp.is_null() && !mc.send_only {
        // SAFETY: the id's live QP and a local GID.
        let _ = unsafe { crate::mem::ibv_detach_mcast(id.c.qp, &ibv_gid { raw: mc.mgid }, 0) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_set_local_ece(p: *mut rdma_cm_id, ece: *mut crate::abi::ibv_ece) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if ece.is_null() {
        return err(libc::EINVAL);
    }
    let _g = global();
    // SAFETY: the program's ECE structure.
    id.st.local_ece = unsafe { *ece };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_remote_ece(p: *mut rdma_cm_id, ece: *mut crate::abi::ibv_ece) -> c_int {
    // SAFETY: the program's id.
    if let Err(e) = unsafe { id_of(p) } {
        return err(e);
    }
    if ece.is_null() {
        return err(libc::EINVAL);
    }
    // The peer's REQ or REP carries no ECE softhca reads: none, as from a peer without ECE.
    // SAFETY: the program's writable ECE structure.
    unsafe { *ece = Default::default() };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migrating id's event counts are taken without waiting on a blocking channel: two
    /// counts, two takes; then none, at once (a plain read would wait for the next event,
    /// under the lock every rdma_* call needs).
    #[test]
    fn a_count_is_taken_without_waiting() {
        let efd = super::super::eventfd(libc::EFD_SEMAPHORE).unwrap();
        let two: u64 = 2;
        // SAFETY: writes 8 bytes from a local to an eventfd just made.
        assert_eq!(unsafe { libc::write(efd.as_raw_fd(), (&two as *const u64).cast(), 8) }, 8);
        assert!(take_count_now(efd.as_raw_fd()));
        assert!(take_count_now(efd.as_raw_fd()));
        assert!(!take_count_now(efd.as_raw_fd()), "none left, and no wait");
    }
}
