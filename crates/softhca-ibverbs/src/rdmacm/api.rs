//! librdmacm's functions, as `softhca_rdma_*` (the `rdma_*` names are `librdmacm.so.1`'s,
//! which forwards to these). Errors follow librdmacm: -1 with errno (NULL with errno for the
//! functions that return a pointer).

use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::ptr::null_mut;

use softhca::transport::cm::sidr_status;
use softhca::wire::mad::{CmRep, CmReq, CmSidrRep, CmSidrReq, CmaHeader};

use super::abi::*;
use super::*;
use crate::abi::*;
use crate::set_errno;

/// -1 with errno.
fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn result(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// The id behind a program's pointer.
///
/// # Safety
/// `p` is null or an id of this library not yet destroyed.
unsafe fn id_of<'a>(p: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program's pointer is the `c` field, the first of a live `Id`.
    Ok(unsafe { &mut *(p as *mut Id) })
}

/// # Safety
/// `p` is null or a channel of this library not yet destroyed.
unsafe fn channel_of<'a>(p: *mut rdma_event_channel) -> Option<&'a Channel> {
    // SAFETY: the program's pointer is the first field of a live `Channel`.
    (!p.is_null()).then(|| unsafe { &*(p as *const Channel) })
}

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
    if !channel.is_null() {
        // Ids still on it (the program should have destroyed them first) get no more events,
        // as the kernel's ids go with a closed rdma_cm descriptor; nothing writes to the
        // freed channel.
        let g = global();
        for &p in g.ids.values() {
            // SAFETY: registered ids are live (under the lock).
            let id = unsafe { &mut *p };
            if id.c.channel == channel {
                id.c.channel = null_mut();
            }
        }
        drop(g);
        // SAFETY: a channel of this library that the program gives up.
        drop(unsafe { Box::from_raw(channel as *mut Channel) });
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
unsafe fn create_id(
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
        (channel, null_mut())
    };
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
        g.ports.retain(|_, s| *s != id.serial);
        g.listeners.retain(|_, s| *s != id.serial);
        if let Some(d) = g.dev.as_mut() {
            if id.st.phase == Phase::Listen {
                let sid = service_id(id.c.ps, id.st.port);
                d.agent.cm().unlisten(sid);
            }
            if let Some(comm) = id.st.comm.take() {
                d.agent.cm().destroy(comm);
                d.agent.transmit();
            }
        }
        g.conns.retain(|_, s| *s != id.serial);
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
        drop(unsafe { Box::from_raw(id.own) });
    }
    // SAFETY: out of the registry, so nothing else reaches it.
    drop(unsafe { Box::from_raw(id as *mut Id) });
    0
}

/// The service ID of a port in a port space (`RDMA_IB_IP_PS_*` | port).
fn service_id(ps: c_int, port: u16) -> u64 {
    ((ps as u64) << 16) | u64::from(port)
}

/// Binds `id` to `addr`: the device (opened on that address if it is not open yet) and a port.
fn bind(g: &mut Global, id: &mut Id, addr: SocketAddr) -> Result<(), c_int> {
    if id.st.phase != Phase::Idle {
        return Err(libc::EINVAL);
    }
    let ip = addr.ip();
    if !ip.is_unspecified() {
        let dev = match g.open(Some(ip)) {
            Ok(d) => d,
            Err(_) if !is_local(ip) => return Err(libc::EADDRNOTAVAIL),
            Err(e) => return Err(e),
        };
        if dev.addr != ip {
            return Err(if is_local(ip) { libc::ENODEV } else { libc::EADDRNOTAVAIL });
        }
        id.c.verbs = dev.ctx;
        id.c.pd = dev.pd;
        id.c.port_num = 1;
        id.c.route.addr.ibaddr.sgid = ibv_gid { raw: dev.gid };
        id.c.route.addr.ibaddr.pkey = 0xFFFF;
    }
    let port = g.take_port(id.c.ps, addr.port(), id.serial)?;
    id.st.port = port;
    write_sa(&mut id.c.route.addr.src, SocketAddr::new(ip, port));
    id.st.phase = Phase::AddrBound;
    Ok(())
}

/// Whether `ip` is an address of this host (a UDP socket can bind it).
fn is_local(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the program's id and address.
    let (id, a) = match (unsafe { id_of(p) }, unsafe { read_sa(addr) }) {
        (Ok(id), Some(a)) => (id, a),
        (Err(e), _) => return err(e),
        (_, None) => return err(if addr.is_null() { libc::EINVAL } else { libc::EAFNOSUPPORT }),
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
        (Ok(id), s, Some(d)) => (id, s, d),
        (Err(e), ..) => return err(e),
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
        // The kernel's route to the destination: unreachable is the event's status.
        let reach = UdpSocket::bind(SocketAddr::new(addr, 0)).and_then(|s| s.connect(SocketAddr::new(dst.ip(), 4791)));
        if let Err(e) = reach {
            id.queue(Event::new(id, RDMA_CM_EVENT_ADDR_ERROR, -e.raw_os_error().unwrap_or(libc::EHOSTUNREACH)));
        } else {
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
        // SAFETY: the id's addresses, written by resolve_addr.
        let (src, dst) = unsafe {
            (
                read_sa(&id.c.route.addr.src as *const _ as *const libc::sockaddr),
                read_sa(&id.c.route.addr.dst as *const _ as *const libc::sockaddr),
            )
        };
        let flow_label = src.zip(dst).map_or(0, |(s, d)| roce_flow_label(s, d));
        fill_path(id, mtu, flow_label);
        id.st.phase = Phase::RouteResolved;
        id.queue(Event::new(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    }
    result(complete(id))
}

/// For a synchronous id: waits for the event its call started (librdmacm's `ucma_complete`),
/// keeps it in `id->event`, and turns a failed one into errno.
fn complete(id: &mut Id) -> Result<(), c_int> {
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
    let sid = service_id(id.c.ps, id.st.port);
    let dev = match g.open(None) {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    dev.agent.cm().listen(sid);
    g.listeners.insert(sid, id.serial);
    id.st.phase = Phase::Listen;
    debug(|| format!("id {}: listening on port {} (service ID {sid:#018x})", id.serial, id.st.port));
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    // SAFETY: the program's id.
    let l = match unsafe { id_of(listen) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if out.is_null() || !l.sync || global().id(l.serial).is_none_or(|l| l.st.phase != Phase::Listen) {
        return err(libc::EINVAL);
    }
    if !l.c.event.is_null() {
        // SAFETY: the event kept from the listener's last failed call.
        unsafe { softhca_rdma_ack_cm_event(l.c.event) };
        l.c.event = null_mut();
    }
    let mut ev = null_mut();
    // SAFETY: the listener's own channel; a local out pointer.
    if unsafe { softhca_rdma_get_cm_event(l.c.channel, &mut ev) } != 0 {
        return -1;
    }
    // SAFETY: the event just taken.
    let e = unsafe { &mut *ev };
    if e.status != 0 || e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        let code = if e.status != 0 { e.status.abs() } else { libc::EINVAL };
        // SAFETY: the event just taken.
        unsafe { softhca_rdma_ack_cm_event(ev) };
        return err(code);
    }
    // SAFETY: a CONNECT_REQUEST's id is the new one, live until the program destroys it.
    let new = unsafe { &mut *(e.id as *mut Id) };
    let qp_init = global().id(new.serial).and_then(|n| n.st.qp_init.take());
    if let Some(mut attr) = qp_init {
        // SAFETY: the new id and the listener's QP attributes (their PD is the listener's).
        if unsafe { softhca_rdma_create_qp(&mut new.c, l.c.pd, &mut attr) } != 0 {
            // SAFETY: errno of this thread, just set.
            let code = unsafe { *libc::__errno_location() };
            // SAFETY: as above.
            unsafe {
                softhca_rdma_reject(&mut new.c, std::ptr::null(), 0);
                softhca_rdma_ack_cm_event(ev);
                softhca_rdma_destroy_id(&mut new.c);
            }
            return err(code);
        }
    }
    new.c.event = ev;
    // SAFETY: the program's out pointer.
    unsafe { *out = &mut new.c };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_connect(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the program's id and parameters.
    let (id, param) = match unsafe { id_of(p) } {
        Ok(id) => (id, unsafe { param.as_ref() }),
        Err(e) => return err(e),
    };
    {
        let mut g = global();
        if id.st.phase != Phase::RouteResolved {
            return err(libc::EINVAL);
        }
        if id.c.qp_type == IBV_QPT_UD {
            if let Err(e) = sidr_connect(&mut g, id, param) {
                return err(e);
            }
            drop(g);
            wake();
            return result(complete(id));
        }
        let qpn = if id.c.qp.is_null() {
            match param {
                Some(p) => p.qp_num,
                None => return err(libc::EINVAL),
            }
        } else {
            // SAFETY: the id's live QP.
            unsafe { (*id.c.qp).qp_num }
        };
        let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
        if let Err(e) = valid_param(id, param, dev.max_resp, dev.max_init) {
            return err(e);
        }
        // librdmacm's rdma_connect: the program's values, 0xFF for the device's maxima.
        let resp = param.map_or(RDMA_MAX_RESP_RES, |p| p.responder_resources);
        let init = param.map_or(RDMA_MAX_INIT_DEPTH, |p| p.initiator_depth);
        let resp = if resp == RDMA_MAX_RESP_RES { dev.max_resp } else { resp };
        let init = if init == RDMA_MAX_INIT_DEPTH { dev.max_init } else { init };
        let guid = ca_guid(dev.gid);
        id.st.responder_resources = resp;
        id.st.initiator_depth = init;
        id.st.retry_count = param.map_or(7, |p| p.retry_count.min(7));
        id.st.rnr_retry_count = param.map_or(7, |p| p.rnr_retry_count.min(7));
        id.st.flow_control = param.map_or(0, |p| p.flow_control & 1);
        // SAFETY: the id's addresses, written by resolve.
        let (src, dst) = unsafe {
            (
                read_sa(&id.c.route.addr.src as *const _ as *const libc::sockaddr),
                read_sa(&id.c.route.addr.dst as *const _ as *const libc::sockaddr),
            )
        };
        let (Some(src), Some(dst)) = (src, dst) else { return err(libc::EINVAL) };
        let mut req = CmReq {
            service_id: service_id(id.c.ps, dst.port()),
            local_ca_guid: guid,
            local_qpn: qpn,
            responder_resources: resp,
            initiator_depth: init,
            remote_cm_response_timeout: cm_timing().0,
            transport_service_type: if id.c.qp_type == IBV_QPT_UC { 1 } else { 0 },
            end_to_end_flow_control: id.st.flow_control,
            starting_psn: id.st.psn,
            local_cm_response_timeout: cm_timing().0,
            retry_count: id.st.retry_count,
            partition_key: 0xFFFF,
            path_mtu: id.path.mtu,
            rnr_retry_count: id.st.rnr_retry_count,
            max_cm_retries: cm_timing().1,
            srq: u8::from(!id.c.srq.is_null() || param.is_some_and(|p| p.srq != 0)),
            primary_local_lid: 0xFFFF,
            primary_remote_lid: 0xFFFF,
            primary_local_gid: id.c.route.addr.ibaddr.sgid.raw,
            primary_remote_gid: id.c.route.addr.ibaddr.dgid.raw,
            primary_flow_label: u32::from_be(id.path.flow_label),
            primary_traffic_class: id.st.tos,
            primary_hop_limit: 64,
            primary_local_ack_timeout: LOCAL_ACK_TIMEOUT,
            ..Default::default()
        };
        let hdr = CmaHeader { src_port: src.port(), src: src.ip(), dst: dst.ip() };
        if hdr.emit(&mut req.private_data).is_err() {
            return err(libc::EINVAL);
        }
        if let Some(p) = param {
            let room = req.private_data.len() - CmaHeader::LEN;
            if usize::from(p.private_data_len) > room {
                return err(libc::EINVAL);
            }
            if !p.private_data.is_null() {
                // SAFETY: the program's private data of the length it gives.
                let d = unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) };
                req.private_data[CmaHeader::LEN..CmaHeader::LEN + d.len()].copy_from_slice(d);
            }
        }
        let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
        // The RTU waits until the QP is ready for the responder's first packet.
        let comm = dev.agent.cm().request_held(now(), req.primary_remote_gid, req);
        dev.agent.transmit();
        g.conns.insert(comm, id.serial);
        id.st.comm = Some(comm);
        id.st.phase = Phase::Connect;
        debug(|| format!("id {}: REQ to {dst} (QPN {qpn:#x}, comm ID {comm:#x})", id.serial));
    }
    wake();
    result(complete(id))
}

/// librdmacm's `ucma_valid_param` (TCP port space only): connection parameters are needed
/// without a QP, and resources beyond the device's are EINVAL (0xFF asks for the maximum).
fn valid_param(id: &Id, param: Option<&rdma_conn_param>, max_resp: u8, max_init: u8) -> Result<(), c_int> {
    if id.c.ps != RDMA_PS_TCP {
        return Ok(());
    }
    let Some(p) = param else {
        return if id.c.qp.is_null() { Err(libc::EINVAL) } else { Ok(()) };
    };
    let over = |v: u8, max: u8, any: u8| v != any && v > max;
    if over(p.responder_resources, max_resp, RDMA_MAX_RESP_RES)
        || over(p.initiator_depth, max_init, RDMA_MAX_INIT_DEPTH)
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `rdma_connect` of a UD id: a SIDR REQ for the destination's service, carrying the cma
/// header and the program's private data (at most 180 bytes), as Linux's cma_resolve_ib_udp.
fn sidr_connect(g: &mut Global, id: &mut Id, param: Option<&rdma_conn_param>) -> Result<(), c_int> {
    // SAFETY: the id's addresses, written by resolve.
    let (src, dst) = unsafe {
        (
            read_sa(&id.c.route.addr.src as *const _ as *const libc::sockaddr),
            read_sa(&id.c.route.addr.dst as *const _ as *const libc::sockaddr),
        )
    };
    let (Some(src), Some(dst)) = (src, dst) else { return Err(libc::EINVAL) };
    let mut req =
        CmSidrReq { partition_key: 0xFFFF, service_id: service_id(id.c.ps, dst.port()), ..Default::default() };
    CmaHeader { src_port: src.port(), src: src.ip(), dst: dst.ip() }
        .emit(&mut req.private_data)
        .map_err(|_| libc::EINVAL)?;
    if let Some(p) = param {
        let room = req.private_data.len() - CmaHeader::LEN;
        if usize::from(p.private_data_len) > room {
            return Err(libc::EINVAL);
        }
        if !p.private_data.is_null() {
            // SAFETY: the program's private data of the length it gives.
            let d = unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) };
            req.private_data[CmaHeader::LEN..CmaHeader::LEN + d.len()].copy_from_slice(d);
        }
    }
    let dgid = id.c.route.addr.ibaddr.dgid.raw;
    let dev = g.dev.as_mut().ok_or(libc::ENODEV)?;
    let comm = dev.agent.cm().sidr_request(now(), dgid, req, cm_timing().0, cm_timing().1);
    dev.agent.transmit();
    g.conns.insert(comm, id.serial);
    id.st.comm = Some(comm);
    id.st.phase = Phase::Connect;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_accept(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    // SAFETY: the program's id and parameters.
    let (id, param) = match unsafe { id_of(p) } {
        Ok(id) => (id, unsafe { param.as_ref() }),
        Err(e) => return err(e),
    };
    {
        let mut g = global();
        if id.st.phase != Phase::ReqRcvd {
            return err(libc::EINVAL);
        }
        let Some(comm) = id.st.comm else { return err(libc::EINVAL) };
        if id.c.qp_type == IBV_QPT_UD {
            // A SIDR request: the SIDR REP names the QP and its Q_Key; no RTU follows.
            let qpn = match (id.c.qp.is_null(), param) {
                // SAFETY: the id's live QP.
                (false, _) => unsafe { (*id.c.qp).qp_num },
                (true, Some(p)) => p.qp_num,
                (true, None) => return err(libc::EINVAL),
            };
            let mut rep = CmSidrRep {
                status: sidr_status::SUCCESS,
                qpn,
                service_id: service_id(id.c.ps, id.st.port),
                qkey: qkey_of(id.c.ps),
                ..Default::default()
            };
            if let Some(p) = param.filter(|p| !p.private_data.is_null()) {
                if usize::from(p.private_data_len) > rep.private_data.len() {
                    return err(libc::EINVAL);
                }
                // SAFETY: the program's private data of the length it gives.
                let d = unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) };
                rep.private_data[..d.len()].copy_from_slice(d);
            }
            g.conns.remove(&comm);
            id.st.comm = None;
            let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
            if !dev.agent.cm().sidr_reply(now(), comm, rep) {
                return err(libc::EINVAL);
            }
            dev.agent.transmit();
            id.st.phase = Phase::Connected;
            return 0;
        }
        let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
        if let Err(e) = valid_param(id, param, dev.max_resp, dev.max_init) {
            return err(e);
        }
        // librdmacm's rdma_accept: the program's values, or (none, 0xFF) the request's
        // bounded by the device's.
        id.st.initiator_depth = match param.map(|p| p.initiator_depth) {
            Some(d) if d != RDMA_MAX_INIT_DEPTH => d,
            _ => id.st.initiator_depth.min(dev.max_init),
        };
        id.st.responder_resources = match param.map(|p| p.responder_resources) {
            Some(r) if r != RDMA_MAX_RESP_RES => r,
            _ => id.st.responder_resources.min(dev.max_resp),
        };
        let guid = ca_guid(dev.gid);
        let qpn = match (id.c.qp.is_null(), param) {
            // SAFETY: the id's live QP.
            (false, _) => unsafe { (*id.c.qp).qp_num },
            (true, Some(p)) => p.qp_num,
            (true, None) => return err(libc::EINVAL),
        };
        if !id.c.qp.is_null() {
            if let Err(e) = g.ready_qp(id) {
                let _ = modify_err(id);
                return err(e);
            }
        }
        let mut rep = CmRep {
            local_qpn: qpn,
            starting_psn: id.st.psn,
            responder_resources: id.st.responder_resources,
            initiator_depth: id.st.initiator_depth,
            target_ack_delay: TARGET_ACK_DELAY,
            end_to_end_flow_control: param.map_or(0, |p| p.flow_control & 1),
            rnr_retry_count: param.map_or(7, |p| p.rnr_retry_count.min(7)),
            srq: u8::from(!id.c.srq.is_null() || param.is_some_and(|p| p.srq != 0)),
            local_ca_guid: guid,
            ..Default::default()
        };
        if let Some(p) = param {
            if usize::from(p.private_data_len) > rep.private_data.len() {
                return err(libc::EINVAL);
            }
            if !p.private_data.is_null() {
                // SAFETY: the program's private data of the length it gives.
                let d = unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) };
                rep.private_data[..d.len()].copy_from_slice(d);
            }
        }
        let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
        if !dev.agent.cm().reply_with(now(), comm, rep) {
            return err(libc::EINVAL);
        }
        dev.agent.transmit();
        id.st.phase = Phase::Accepting;
        debug(|| format!("id {}: REP (QPN {qpn:#x})", id.serial));
    }
    wake();
    result(complete(id))
}

/// Rejects a connection request with `reason`.
unsafe fn reject(p: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let mut g = global();
    if id.st.phase != Phase::ReqRcvd {
        return err(libc::EINVAL);
    }
    let Some(comm) = id.st.comm.take() else { return err(libc::EINVAL) };
    let d: &[u8] = if data.is_null() {
        &[]
    } else {
        // SAFETY: the program's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(data.cast(), len.into()) }
    };
    // The kernel's limits: a REJ's private data (148 bytes), a SIDR REP's (136).
    let room = if id.c.qp_type == IBV_QPT_UD { 136 } else { 148 };
    if d.len() > room {
        id.st.comm = Some(comm);
        return err(libc::EINVAL);
    }
    g.conns.remove(&comm);
    if let Some(dev) = g.dev.as_mut() {
        if id.c.qp_type == IBV_QPT_UD {
            dev.agent.cm().sidr_reject(comm, sidr_status::REJECT, d);
        } else {
            dev.agent.cm().reject_with(comm, reason, d);
        }
        dev.agent.transmit();
    }
    id.st.phase = Phase::Failed;
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_reject(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: the program's id and data.
    unsafe { reject(p, data, len, REJ_CONSUMER) }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_reject_ece(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: the program's id and data.
    unsafe { reject(p, data, len, REJ_VENDOR_OPTION_NOT_SUPPORTED) }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    {
        let mut g = global();
        let _ = modify_err(id);
        match id.st.phase {
            Phase::Connected => {
                let Some(comm) = id.st.comm else { return err(libc::EINVAL) };
                if let Some(dev) = g.dev.as_mut() {
                    dev.agent.cm().disconnect(now(), comm);
                    dev.agent.transmit();
                }
                id.st.phase = Phase::Disconnected;
            }
            // The peer disconnected first: its DREQ was answered (a synchronous id still
            // takes its DISCONNECTED event below, as librdmacm's ucma_complete does).
            Phase::Disconnected => {}
            // A connection that was tried and is gone (rejected, unreachable) or still under
            // way: the kernel has a CM id for it and answers 0; only an id that never
            // connected is EINVAL.
            Phase::Connect | Phase::Accepting | Phase::ReqRcvd | Phase::Failed => {
                if let (Some(comm), Some(dev)) = (id.st.comm, g.dev.as_mut()) {
                    dev.agent.cm().destroy(comm);
                    dev.agent.transmit();
                    g.conns.remove(&comm);
                    id.st.comm = None;
                }
                return 0;
            }
            _ => return err(libc::EINVAL),
        }
    }
    wake();
    result(complete(id))
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_establish(p: *mut rdma_cm_id) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    // With a QP, librdmacm readied it and sent the RTU itself (EINVAL, as librdmacm).
    let mut g = global();
    if !id.c.qp.is_null() || id.st.phase != Phase::Connected {
        return err(libc::EINVAL);
    }
    let (Some(comm), Some(dev)) = (id.st.comm, g.dev.as_mut()) else { return err(libc::EINVAL) };
    if !dev.agent.cm().establish(comm) {
        return err(libc::EINVAL);
    }
    dev.agent.transmit();
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_notify(p: *mut rdma_cm_id, event: c_int) -> c_int {
    /// `IBV_EVENT_COMM_EST` and `IBV_EVENT_PATH_MIG`: the events Linux's `ib_cm_notify` takes.
    const COMM_EST: c_int = 4;
    const PATH_MIG: c_int = 6;
    // SAFETY: the program's id.
    match unsafe { id_of(p) } {
        // The RTU softhca's CM waits for is the only proof of establishment it takes; a
        // Communication Established the program saw first changes nothing here.
        Ok(_) if event == COMM_EST || event == PATH_MIG => 0,
        Ok(_) => err(libc::EINVAL),
        Err(e) => err(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_init_qp_attr(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || mask.is_null() {
        return err(libc::EINVAL);
    }
    let g = global();
    // SAFETY: the program's attribute structure, its state chosen by the program.
    let state = unsafe { (*attr).qp_state };
    match g.qp_attr(id, state) {
        Ok((a, m)) => {
            // SAFETY: the program's writable attribute structure and mask.
            unsafe {
                *attr = a;
                *mask = m;
            }
            0
        }
        Err(e) => err(e),
    }
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
        // SAFETY: the program's out pointer; the event is the program's until it acks it.
        unsafe { *event = &mut Box::leak(ev).c };
        return 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
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

/// librdmacm's `ucma_create_cqs`: a completion channel and a CQ for each missing CQ.
unsafe fn create_cqs(id: &mut Id, send: u32, recv: u32) -> Result<(), c_int> {
    let ctx = id.c.verbs;
    for (size, channel, cq) in
        [(recv, &mut id.c.recv_cq_channel, &mut id.c.recv_cq), (send, &mut id.c.send_cq_channel, &mut id.c.send_cq)]
    {
        if size == 0 || !cq.is_null() {
            continue;
        }
        // SAFETY: the id's live context.
        *channel = unsafe { crate::cq::ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: as above, with the channel just made.
        *cq = unsafe { crate::cq::ibv_create_cq(ctx, size.max(1) as c_int, null_mut(), *channel, 0) };
        if cq.is_null() {
            // SAFETY: errno of this thread, just set.
            return Err(unsafe { *libc::__errno_location() });
        }
    }
    Ok(())
}

/// librdmacm's `ucma_destroy_cqs`.
unsafe fn destroy_cqs(id: &mut Id) {
    for (channel, cq) in
        [(&mut id.c.recv_cq_channel, &mut id.c.recv_cq), (&mut id.c.send_cq_channel, &mut id.c.send_cq)]
    {
        if !cq.is_null() {
            // SAFETY: a CQ this module made for the id.
            unsafe { crate::cq::ibv_destroy_cq(*cq) };
            *cq = null_mut();
        }
        if !channel.is_null() {
            // SAFETY: as above.
            unsafe { crate::cq::ibv_destroy_comp_channel(*channel) };
            *channel = null_mut();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's init attributes.
    let a = unsafe { &mut *attr };
    // SAFETY: an all-zero extended init structure is valid.
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd;
    // SAFETY: the program's id; a local structure.
    let rc = unsafe { softhca_rdma_create_qp_ex(p, &mut ex) };
    if rc == 0 {
        a.cap = ex.cap;
        a.send_cq = ex.send_cq;
        a.recv_cq = ex.recv_cq;
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_qp_ex(p: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || id.c.verbs.is_null() || !id.c.qp.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's init attributes.
    let a = unsafe { &mut *attr };
    let g = global();
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = id.c.pd;
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
    // SAFETY: the program's PD.
    } else if unsafe { (*a.pd).context } != id.c.verbs {
        return err(libc::EINVAL);
    }
    if a.pd.is_null() {
        return err(libc::EINVAL);
    }
    if a.srq.is_null() {
        a.srq = id.c.srq;
    }
    let made = a.send_cq.is_null() || a.recv_cq.is_null();
    if made {
        let recv = if a.recv_cq.is_null() && a.srq.is_null() { a.cap.max_recv_wr } else { 0 };
        let send = if a.send_cq.is_null() { a.cap.max_send_wr } else { 0 };
        // SAFETY: the id's context.
        if let Err(e) = unsafe { create_cqs(id, send, recv.max(u32::from(a.recv_cq.is_null()))) } {
            // SAFETY: the CQs just made.
            unsafe { destroy_cqs(id) };
            return err(e);
        }
        if a.send_cq.is_null() {
            a.send_cq = id.c.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = id.c.recv_cq;
        }
    }
    // SAFETY: the id's context and attributes checked above.
    let qp = unsafe { crate::qp::create_qp_ex(id.c.verbs, a) };
    if qp.is_null() {
        // SAFETY: errno of this thread, just set.
        let e = unsafe { *libc::__errno_location() };
        if made {
            // SAFETY: the CQs just made.
            unsafe { destroy_cqs(id) };
        }
        return err(e);
    }
    id.c.qp = qp;
    id.c.pd = a.pd;
    id.st.own_cqs = made;
    // librdmacm's ucma_init_conn_qp / ucma_init_ud_qp.
    let states: &[c_int] =
        if a.qp_type == IBV_QPT_UD { &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] } else { &[IBV_QPS_INIT] };
    for &s in states {
        let r = g.qp_attr(id, s).and_then(|(mut qa, mask)| {
            // SAFETY: the QP just made.
            match unsafe { crate::qp::ibv_modify_qp(qp, &mut qa, mask) } {
                0 => Ok(()),
                e => Err(e),
            }
        });
        if let Err(e) = r {
            drop(g);
            // SAFETY: the QP just made, and the id's own CQs.
            unsafe { softhca_rdma_destroy_qp(p) };
            return err(e);
        }
    }
    drop(g);
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_qp(p: *mut rdma_cm_id) {
    // SAFETY: the program's id.
    let Ok(id) = (unsafe { id_of(p) }) else { return };
    let _g = global();
    if !id.c.qp.is_null() {
        // SAFETY: the id's QP, taken out under the lock the CM thread moves it under.
        unsafe { crate::qp::ibv_destroy_qp(id.c.qp) };
        id.c.qp = null_mut();
    }
    if id.st.own_cqs {
        // SAFETY: the CQs rdma_create_qp made.
        unsafe { destroy_cqs(id) };
        id.st.own_cqs = false;
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_srq(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    if attr.is_null() || id.c.verbs.is_null() {
        return err(libc::EINVAL);
    }
    let pd = if pd.is_null() { id.c.pd } else { pd };
    if pd.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: a PD of the id's context and the program's attributes.
    let srq = unsafe { crate::qp::ibv_create_srq(pd, attr) };
    if srq.is_null() {
        return -1;
    }
    id.c.srq = srq;
    id.c.pd = pd;
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_srq_ex(p: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    let _ = (p, attr);
    // XRC SRQs (the reason for the extended call) are not built.
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_srq(p: *mut rdma_cm_id) {
    // SAFETY: the program's id.
    let Ok(id) = (unsafe { id_of(p) }) else { return };
    if !id.c.srq.is_null() {
        // SAFETY: the id's SRQ.
        unsafe { crate::qp::ibv_destroy_srq(id.c.srq) };
        id.c.srq = null_mut();
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init: *mut ibv_qp_init_attr,
) -> c_int {
    if out.is_null() || res.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's address information.
    let r = unsafe { &*res };
    let mut p = null_mut();
    // SAFETY: a local out pointer.
    if unsafe { create_id(null_mut(), &mut p, null_mut(), r.ai_port_space, r.ai_qp_type) } != 0 {
        return -1;
    }
    // SAFETY: as the calls' contracts say; every failure destroys the id and keeps errno.
    let rc = unsafe {
        if r.ai_flags & RAI_PASSIVE != 0 {
            let rc = softhca_rdma_bind_addr(p, r.ai_src_addr);
            let id = &mut *(p as *mut Id);
            if rc == 0 && !pd.is_null() {
                id.c.pd = pd;
            }
            if rc == 0 && !qp_init.is_null() {
                let mut a = copy_init(&*qp_init);
                a.qp_type = r.ai_qp_type;
                let _g = global();
                id.st.qp_init = Some(a);
            }
            rc
        } else {
            let mut rc = softhca_rdma_resolve_addr(p, r.ai_src_addr, r.ai_dst_addr, 2000);
            if rc == 0 {
                rc = softhca_rdma_resolve_route(p, 2000);
            }
            if rc == 0 && !qp_init.is_null() {
                (*qp_init).qp_type = r.ai_qp_type;
                rc = softhca_rdma_create_qp(p, pd, qp_init);
            }
            rc
        }
    };
    if rc != 0 {
        // SAFETY: errno of this thread, just set.
        let e = unsafe { *libc::__errno_location() };
        // SAFETY: the id just made.
        unsafe { softhca_rdma_destroy_id(p) };
        return err(e);
    }
    // SAFETY: the program's out pointer.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_destroy_ep(p: *mut rdma_cm_id) {
    if p.is_null() {
        return;
    }
    // SAFETY: the program's id and what it holds.
    unsafe {
        if !(*p).qp.is_null() {
            softhca_rdma_destroy_qp(p);
        }
        if !(*p).srq.is_null() {
            softhca_rdma_destroy_srq(p);
        }
        softhca_rdma_destroy_id(p);
    }
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
        (channel, null_mut())
    };
    let _g = global();
    // Queued events of the id go with it.
    let from = id.channel();
    let mut moved = Vec::new();
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
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a local; the eventfd is in semaphore mode.
        unsafe { libc::read(from.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
    let old_own = std::mem::replace(&mut id.own, own);
    id.c.channel = to;
    id.sync = !own.is_null();
    for ev in moved {
        id.queue(ev);
    }
    if !old_own.is_null() {
        // SAFETY: the id's former own channel, emptied of its events.
        drop(unsafe { Box::from_raw(old_own) });
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
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
            // SAFETY: one byte, as the length says.
            id.st.ack_timeout = Some(unsafe { *(optval as *const u8) }.min(31));
        }
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) if optlen == size_of::<c_int>() => {}
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
        Ok(id) => unsafe { read_sa(&id.c.route.addr.src as *const _ as *const libc::sockaddr) }
            .map_or(0, |a| a.port().to_be()),
        Err(_) => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    // SAFETY: the program's id.
    match unsafe { id_of(p) } {
        // SAFETY: the id's own address storage.
        Ok(id) => unsafe { read_sa(&id.c.route.addr.dst as *const _ as *const libc::sockaddr) }
            .map_or(0, |a| a.port().to_be()),
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

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _c: *mut c_void,
) -> c_int {
    err(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _c: *mut c_void,
) -> c_int {
    err(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    err(libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_set_local_ece(p: *mut rdma_cm_id, ece: *mut crate::ece::ibv_ece) -> c_int {
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
pub unsafe extern "C" fn softhca_rdma_get_remote_ece(p: *mut rdma_cm_id, ece: *mut crate::ece::ibv_ece) -> c_int {
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

/// A heap copy of a C socket address of `len` bytes (librdmacm's `ucma_copy_addr`).
///
/// # Safety
/// `sa` points to `len` readable bytes.
unsafe fn copy_sa(sa: *const libc::sockaddr, len: libc::socklen_t) -> (*mut libc::sockaddr, libc::socklen_t) {
    let n = (len as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut s: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `n` bytes from the caller's address into a 128-byte storage.
    unsafe { std::ptr::copy_nonoverlapping(sa.cast::<u8>(), (&mut *s as *mut libc::sockaddr_storage).cast::<u8>(), n) };
    (Box::into_raw(s).cast(), n as libc::socklen_t)
}

/// librdmacm 44's `rdma_getaddrinfo` (addrinfo.c): `getaddrinfo` with the hints converted
/// (RAI_PASSIVE, RAI_NUMERICHOST, the family, the socket type and protocol of the QP type and
/// port space), the first answer converted back: its QP type and port space from the hints
/// or from its socket type and protocol, RAI_PASSIVE, the address as source (passive) or
/// destination; a source address from the hints when there is none. A `getaddrinfo` error is
/// returned as its EAI code, as librdmacm returns it. (AF_IB addresses are not built.)
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's hints, if any.
    let h = unsafe { hints.as_ref() };
    // SAFETY: an all-zero rdma_addrinfo is valid.
    let mut ai: Box<rdma_addrinfo> = Box::new(unsafe { std::mem::zeroed() });
    if !node.is_null() || !service.is_null() {
        // SAFETY: an all-zero addrinfo is valid hints.
        let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
        if let Some(h) = h {
            if h.ai_flags & RAI_PASSIVE != 0 {
                ah.ai_flags = libc::AI_PASSIVE;
            }
            if h.ai_flags & RAI_NUMERICHOST != 0 {
                ah.ai_flags |= libc::AI_NUMERICHOST;
            }
            ah.ai_family = h.ai_family;
            ah.ai_socktype = match h.ai_qp_type {
                IBV_QPT_RC | IBV_QPT_UC => libc::SOCK_STREAM,
                IBV_QPT_UD => libc::SOCK_DGRAM,
                _ => 0,
            };
            ah.ai_protocol = match h.ai_port_space {
                RDMA_PS_TCP => libc::IPPROTO_TCP,
                RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
                RDMA_PS_IB if ah.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
                RDMA_PS_IB if ah.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
                _ => 0,
            };
        }
        let mut found: *mut libc::addrinfo = null_mut();
        let hp = if h.is_some() { &ah as *const libc::addrinfo } else { std::ptr::null() };
        // SAFETY: the program's NUL-terminated strings (or NULL); local hints and out pointer.
        let rc = unsafe { libc::getaddrinfo(node, service, hp, &mut found) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: getaddrinfo succeeded: a list of at least one entry.
        let first = unsafe { &*found };
        ai.ai_qp_type = match (h.map_or(0, |h| h.ai_qp_type), first.ai_socktype) {
            (0, libc::SOCK_STREAM) => IBV_QPT_RC,
            (0, libc::SOCK_DGRAM) => IBV_QPT_UD,
            (t, _) => t,
        };
        ai.ai_port_space = match (h.map_or(0, |h| h.ai_port_space), first.ai_protocol) {
            (0, libc::IPPROTO_TCP) => RDMA_PS_TCP,
            (0, libc::IPPROTO_UDP) => RDMA_PS_UDP,
            (ps, _) => ps,
        };
        ai.ai_family = first.ai_family;
        // SAFETY: getaddrinfo's address of its length; its canonical name is NULL or a
        // NUL-terminated string.
        unsafe {
            let canon = if first.ai_canonname.is_null() { null_mut() } else { libc::strdup(first.ai_canonname) };
            if first.ai_flags & libc::AI_PASSIVE != 0 {
                ai.ai_flags = RAI_PASSIVE;
                ai.ai_src_canonname = canon;
                (ai.ai_src_addr, ai.ai_src_len) = copy_sa(first.ai_addr, first.ai_addrlen);
            } else {
                ai.ai_dst_canonname = canon;
                (ai.ai_dst_addr, ai.ai_dst_len) = copy_sa(first.ai_addr, first.ai_addrlen);
            }
            libc::freeaddrinfo(found);
        }
    } else if let Some(h) = h {
        ai.ai_flags = h.ai_flags;
        ai.ai_family = h.ai_family;
        ai.ai_qp_type = h.ai_qp_type;
        ai.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' destination of its length.
            (ai.ai_dst_addr, ai.ai_dst_len) = unsafe { copy_sa(h.ai_dst_addr, h.ai_dst_len) };
        }
    }
    if let Some(h) = h.filter(|h| ai.ai_src_len == 0 && h.ai_src_len != 0 && !h.ai_src_addr.is_null()) {
        // SAFETY: the hints' source of its length.
        (ai.ai_src_addr, ai.ai_src_len) = unsafe { copy_sa(h.ai_src_addr, h.ai_src_len) };
    }
    // SAFETY: the program's out pointer.
    unsafe { *res = Box::into_raw(ai) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: an rdma_addrinfo this library made, with its parts.
        let ai = unsafe { Box::from_raw(p) };
        for sa in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !sa.is_null() {
                // SAFETY: a sockaddr_storage box of `boxed_sa`.
                drop(unsafe { Box::from_raw(sa as *mut libc::sockaddr_storage) });
            }
        }
        // SAFETY: strdup'ed names or NULL.
        unsafe {
            libc::free(ai.ai_src_canonname.cast());
            libc::free(ai.ai_dst_canonname.cast());
        }
        p = ai.ai_next;
    }
}
