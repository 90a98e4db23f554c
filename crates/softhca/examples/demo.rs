//! The main job for now: one RC QP walks Reset → Init → RTR → RTS → SQD → RTS → Error → Reset,
//! and at each state we try both queues to show what posting does there.

use softhca::*;

fn main() -> Result<()> {
    let ctx = Context::create(DeviceConfig::default().name("softhca0").gid0(Gid::from_ipv4([127, 0, 0, 1].into())))?;
    let dev = ctx.query_device()?;
    let port = ctx.query_port(1)?;
    println!(
        "device {}: max_qp {} max_qp_wr {} max_sge {} max_cqe {}",
        ctx.name(),
        dev.max_qp,
        dev.max_qp_wr,
        dev.max_sge,
        dev.max_cqe
    );
    println!("port 1: {:?}, active MTU {} bytes, GID[0] {}", port.state, port.active_mtu.bytes(), ctx.query_gid(1, 0)?);

    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq).max_send_wr(16).max_recv_wr(16))?;
    println!("created RC QP {:#08x}", qp.qp_num());

    let remote = AddressVector::new(AhAttr::roce(Gid::from_ipv4([127, 0, 0, 2].into()), 0), Mtu::Mtu1024);
    let steps = [
        QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE),
        QpAttr::to_rtr(remote, 0x11).rq_psn(0).max_dest_rd_atomic(16),
        QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(16),
        QpAttr::to_sqd().en_sqd_async_notify(true),
        QpAttr::to_rts(),
        QpAttr::to_error(),
        QpAttr::to_reset(),
    ];
    report(&qp, &cq, &mr, 0);
    for (i, step) in steps.iter().enumerate() {
        let from = qp.state()?;
        qp.modify(step)?;
        println!("\n{from} → {}", qp.state()?);
        while let Some(ev) = ctx.get_async_event() {
            println!("  async event: {:?} on {:?}", ev.event_type, ev.element);
        }
        report(&qp, &cq, &mr, (i as u64 + 1) * 10);
    }
    Ok(())
}

/// Tries one Send and one Receive and says what became of them.
fn report(qp: &Qp, cq: &Cq, mr: &Mr, id: u64) {
    let sge = [mr.sge(0..64)];
    let send = match qp.post_send(&[SendWr::send(id, &sge).signaled()]) {
        Ok(()) => "accepted".to_string(),
        Err(e) => format!("immediate error ({})", e.error),
    };
    let recv = match qp.post_recv(&[RecvWr::new(id + 1, &sge)]) {
        Ok(()) => "accepted".to_string(),
        Err(e) => format!("immediate error ({})", e.error),
    };
    let (sq, rq) = qp.outstanding().unwrap_or((0, 0));
    println!("  post_send: {send}; post_recv: {recv}; held WQEs: SQ {sq}, RQ {rq}");
    while let Ok(Some(wc)) = cq.poll_one() {
        println!("  CQE: wr_id {} status {}", wc.wr_id, wc.status);
    }
}
