//! Connecting and disconnecting an id: `rdma_connect` (a REQ, or a SIDR REQ for a UD id),
//! `rdma_accept`, `rdma_reject`, `rdma_disconnect`, `rdma_establish`, `rdma_notify` and
//! `rdma_init_qp_attr`, with librdmacm's checks of the connection parameters.

use std::ffi::{c_int, c_void};

use softhca::transport::cm::{sidr_status, NotEstablished};
use softhca::wire::mad::{CmRep, CmReq, CmSidrRep, CmSidrReq, CmaHeader};

use super::abi::*;
use super::api::*;
use super::*;
use crate::abi::*;

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
        let (Some(src), Some(dst)) = (id.src_addr(), id.dst_addr()) else { return err(libc::EINVAL) };
        let transport = transport_of(kernel_qp_type(id.c.ps, id.c.qp_type));
        let mut req = CmReq {
            service_id: service_id(id.c.ps, dst.port()),
            local_ca_guid: guid,
            local_qpn: qpn,
            responder_resources: resp,
            initiator_depth: init,
            remote_cm_response_timeout: cm_timing().0,
            transport_service_type: transport.0,
            extended_transport_type: transport.1,
            end_to_end_flow_control: id.st.flow_control,
            starting_psn: id.st.psn,
            local_cm_response_timeout: cm_timing().0,
            retry_count: id.st.retry_count,
            partition_key: 0xFFFF,
            path_mtu: id.path.mtu,
            rnr_retry_count: id.st.rnr_retry_count,
            max_cm_retries: cm_timing().1,
            srq: srq_bit(id, param),
            primary_local_lid: 0xFFFF,
            primary_remote_lid: 0xFFFF,
            primary_local_gid: id.c.route.addr.ibaddr.sgid.raw,
            primary_remote_gid: id.c.route.addr.ibaddr.dgid.raw,
            primary_flow_label: u32::from_be(id.path.flow_label),
            primary_traffic_class: id.path.traffic_class,
            primary_hop_limit: 64,
            primary_local_ack_timeout: local_ack_timeout(id),
            ..Default::default()
        };
        let hdr = CmaHeader { src_port: src.port(), src: src.ip(), dst: dst.ip() };
        if hdr.emit(&mut req.private_data).is_err() {
            return err(libc::EINVAL);
        }
        if let Err(e) = put_private(param, &mut req.private_data[CmaHeader::LEN..]) {
            return err(e);
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

/// A REQ's Transport Service Type and Extended Transport Type for a QP of `qp_type`, as Linux's
/// `cm_format_req` sets them: RC 0, UC 1, an XRC initiator 3 with extended type 1 (XRC).
pub(super) fn transport_of(qp_type: c_int) -> (u8, u8) {
    match qp_type {
        IBV_QPT_UC => (1, 0),
        IBV_QPT_XRC_SEND => (3, 1),
        _ => (0, 0),
    }
}

/// Copies the program's private data (`param`'s, if any) into `dst`, the room the message
/// leaves after any header: more than fits is EINVAL, as the kernel's rdma_cm answers.
fn put_private(param: Option<&rdma_conn_param>, dst: &mut [u8]) -> Result<(), c_int> {
    let Some(p) = param else { return Ok(()) };
    if usize::from(p.private_data_len) > dst.len() {
        return Err(libc::EINVAL);
    }
    if !p.private_data.is_null() {
        // SAFETY: the program's private data of the length it gives.
        let d = unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into()) };
        dst[..d.len()].copy_from_slice(d);
    }
    Ok(())
}

/// The REQ's and REP's SRQ bit as librdmacm sets it: whether the id's QP has an SRQ, or,
/// without a QP, what the program's parameters say.
fn srq_bit(id: &Id, param: Option<&rdma_conn_param>) -> u8 {
    if id.c.qp.is_null() {
        param.map_or(0, |p| u8::from(p.srq != 0))
    } else {
        // SAFETY: the id's live QP.
        u8::from(!unsafe { (*id.c.qp).srq }.is_null())
    }
}

/// librdmacm's `ucma_valid_param` (TCP port space only): connection parameters are needed
/// without a QP, and resources beyond the device's are EINVAL (0xFF asks for the maximum).
pub(super) fn valid_param(id: &Id, param: Option<&rdma_conn_param>, max_resp: u8, max_init: u8) -> Result<(), c_int> {
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
pub(super) fn sidr_connect(g: &mut Global, id: &mut Id, param: Option<&rdma_conn_param>) -> Result<(), c_int> {
    let (Some(src), Some(dst)) = (id.src_addr(), id.dst_addr()) else { return Err(libc::EINVAL) };
    let mut req =
        CmSidrReq { partition_key: 0xFFFF, service_id: service_id(id.c.ps, dst.port()), ..Default::default() };
    CmaHeader { src_port: src.port(), src: src.ip(), dst: dst.ip() }
        .emit(&mut req.private_data)
        .map_err(|_| libc::EINVAL)?;
    put_private(param, &mut req.private_data[CmaHeader::LEN..])?;
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
            if let Err(e) = put_private(param, &mut rep.private_data) {
                return err(e);
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
            srq: srq_bit(id, param),
            local_ca_guid: guid,
            ..Default::default()
        };
        // librdmacm readies the QP before the kernel sees the REP; when the kernel refuses it
        // the QP goes to Error (`ucma_modify_qp_err`).
        if let Err(e) = put_private(param, &mut rep.private_data) {
            let _ = modify_err(id);
            return err(e);
        }
        let Some(dev) = g.dev.as_mut() else { return err(libc::ENODEV) };
        if !dev.agent.cm().reply_with(now(), comm, rep) {
            let _ = modify_err(id);
            return err(libc::EINVAL);
        }
        dev.agent.transmit();
        id.st.phase = Phase::Accepting;
        debug(|| format!("id {}: REP (QPN {qpn:#x})", id.serial));
    }
    wake();
    result(complete(id))
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
                // A UD id's SIDR exchange leaves no connection: its QP went to Error above and
                // the call answers 0, as Linux's rdma_disconnect does for it (no DREQ to send).
                let Some(comm) = id.st.comm else { return 0 };
                if let Some(dev) = g.dev.as_mut() {
                    dev.agent.cm().disconnect(now(), comm);
                    dev.agent.transmit();
                }
                id.st.phase = Phase::Disconnected;
            }
            // The peer disconnected first: its DREQ is answered now, as Linux's rdma_cm sends
            // the DREP at rdma_disconnect (a synchronous id still takes its DISCONNECTED event
            // below, as librdmacm's ucma_complete does).
            Phase::Disconnected => {
                if let (Some(comm), Some(dev)) = (id.st.comm, g.dev.as_mut()) {
                    dev.agent.cm().disconnect(now(), comm);
                    dev.agent.transmit();
                }
            }
            // A connection still under way, or tried and gone (rejected, unreachable): the
            // kernel has a CM id for it and answers 0, sending nothing (Linux's
            // rdma_disconnect tries a DREQ, then a DREP, and the CM refuses both before the
            // connection is established). Its QP is in Error now, so the handshake that goes
            // on fails where it next readies the QP: a REP draws a REJ and CONNECT_ERROR, an
            // accept is refused. Only an id that never connected is EINVAL.
            Phase::Connect | Phase::Accepting | Phase::ReqRcvd | Phase::Failed => return 0,
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
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let established = {
        let mut g = global();
        let (Some(comm), Some(dev)) = (id.st.comm, g.dev.as_mut()) else { return err(libc::EINVAL) };
        let cm = dev.agent.cm();
        match event {
            // A Communication Established the program saw before the RTU came: the connection
            // is established now, its ESTABLISHED event queued (EISCONN if it was already).
            COMM_EST => cm.notify_established(comm).map_err(|e| match e {
                NotEstablished::Already => libc::EISCONN,
                NotEstablished::WrongState => libc::EINVAL,
            }),
            // No alternate path is loaded (no LAP): an established connection stays on its
            // path, as Linux's cm_migrate answers then; EINVAL in any other state.
            PATH_MIG if cm.is_established(comm) => return 0,
            _ => Err(libc::EINVAL),
        }
    };
    match established {
        Ok(()) => {
            wake();
            0
        }
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
