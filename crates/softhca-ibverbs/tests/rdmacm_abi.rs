//! librdmacm's structures as the drop-in lays them out, against `<rdma/rdma_cma.h>` of
//! rdma-core 44 (sizes and offsets printed by a C program compiled against the header).

mod common;

use std::mem::offset_of;
use std::process::Command;

use common::*;
use softhca_ibverbs::abi::ibv_srq_init_attr_ex;
use softhca_ibverbs::rdmacm::abi::*;

#[test]
fn structures_match_the_installed_header() {
    if !(ready()
        && have(std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists(), "rdma/rdma_cma.h (librdmacm-dev)"))
    {
        return;
    }
    let src = scratch().join("layout.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
#include <rdma/rdma_cma.h>
#define P(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))
#define S(t) printf(#t " %zu\n", sizeof(struct t))
int main(void) {
  S(rdma_cm_id); P(rdma_cm_id, route); P(rdma_cm_id, ps); P(rdma_cm_id, port_num); P(rdma_cm_id, event);
  P(rdma_cm_id, send_cq_channel); P(rdma_cm_id, srq); P(rdma_cm_id, pd); P(rdma_cm_id, qp_type);
  S(rdma_addr); P(rdma_addr, addr); S(rdma_route); P(rdma_route, path_rec); P(rdma_route, num_paths);
  S(rdma_cm_event); P(rdma_cm_event, event); P(rdma_cm_event, status); P(rdma_cm_event, param);
  S(rdma_conn_param); P(rdma_conn_param, rnr_retry_count); P(rdma_conn_param, qp_num);
  S(rdma_ud_param); P(rdma_ud_param, ah_attr); P(rdma_ud_param, qp_num); P(rdma_ud_param, qkey);
  S(rdma_addrinfo); P(rdma_addrinfo, ai_src_addr); P(rdma_addrinfo, ai_route_len); P(rdma_addrinfo, ai_next);
  S(ibv_sa_path_rec); P(ibv_sa_path_rec, raw_traffic); P(ibv_sa_path_rec, reversible); P(ibv_sa_path_rec, pkey);
  P(ibv_sa_path_rec, mtu); P(ibv_sa_path_rec, packet_life_time); P(ibv_sa_path_rec, preference);
  S(ibv_srq_init_attr_ex); P(ibv_srq_init_attr_ex, comp_mask); P(ibv_srq_init_attr_ex, srq_type);
  P(ibv_srq_init_attr_ex, pd); P(ibv_srq_init_attr_ex, cq); P(ibv_srq_init_attr_ex, tm_cap);
  return 0;
}
"#,
    )
    .unwrap();
    let exe = scratch().join("layout");
    let out = Command::new("cc").arg("-o").arg(&exe).arg(&src).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let ours = [
        ("rdma_cm_id", size_of::<rdma_cm_id>()),
        ("rdma_cm_id.route", offset_of!(rdma_cm_id, route)),
        ("rdma_cm_id.ps", offset_of!(rdma_cm_id, ps)),
        ("rdma_cm_id.port_num", offset_of!(rdma_cm_id, port_num)),
        ("rdma_cm_id.event", offset_of!(rdma_cm_id, event)),
        ("rdma_cm_id.send_cq_channel", offset_of!(rdma_cm_id, send_cq_channel)),
        ("rdma_cm_id.srq", offset_of!(rdma_cm_id, srq)),
        ("rdma_cm_id.pd", offset_of!(rdma_cm_id, pd)),
        ("rdma_cm_id.qp_type", offset_of!(rdma_cm_id, qp_type)),
        ("rdma_addr", size_of::<rdma_addr>()),
        ("rdma_addr.addr", offset_of!(rdma_addr, ibaddr)),
        ("rdma_route", size_of::<rdma_route>()),
        ("rdma_route.path_rec", offset_of!(rdma_route, path_rec)),
        ("rdma_route.num_paths", offset_of!(rdma_route, num_paths)),
        ("rdma_cm_event", size_of::<rdma_cm_event>()),
        ("rdma_cm_event.event", offset_of!(rdma_cm_event, event)),
        ("rdma_cm_event.status", offset_of!(rdma_cm_event, status)),
        ("rdma_cm_event.param", offset_of!(rdma_cm_event, param)),
        ("rdma_conn_param", size_of::<rdma_conn_param>()),
        ("rdma_conn_param.rnr_retry_count", offset_of!(rdma_conn_param, rnr_retry_count)),
        ("rdma_conn_param.qp_num", offset_of!(rdma_conn_param, qp_num)),
        ("rdma_ud_param", size_of::<rdma_ud_param>()),
        ("rdma_ud_param.ah_attr", offset_of!(rdma_ud_param, ah_attr)),
        ("rdma_ud_param.qp_num", offset_of!(rdma_ud_param, qp_num)),
        ("rdma_ud_param.qkey", offset_of!(rdma_ud_param, qkey)),
        ("rdma_addrinfo", size_of::<rdma_addrinfo>()),
        ("rdma_addrinfo.ai_src_addr", offset_of!(rdma_addrinfo, ai_src_addr)),
        ("rdma_addrinfo.ai_route_len", offset_of!(rdma_addrinfo, ai_route_len)),
        ("rdma_addrinfo.ai_next", offset_of!(rdma_addrinfo, ai_next)),
        ("ibv_sa_path_rec", size_of::<ibv_sa_path_rec>()),
        ("ibv_sa_path_rec.raw_traffic", offset_of!(ibv_sa_path_rec, raw_traffic)),
        ("ibv_sa_path_rec.reversible", offset_of!(ibv_sa_path_rec, reversible)),
        ("ibv_sa_path_rec.pkey", offset_of!(ibv_sa_path_rec, pkey)),
        ("ibv_sa_path_rec.mtu", offset_of!(ibv_sa_path_rec, mtu)),
        ("ibv_sa_path_rec.packet_life_time", offset_of!(ibv_sa_path_rec, packet_life_time)),
        ("ibv_sa_path_rec.preference", offset_of!(ibv_sa_path_rec, preference)),
        ("ibv_srq_init_attr_ex", size_of::<ibv_srq_init_attr_ex>()),
        ("ibv_srq_init_attr_ex.comp_mask", offset_of!(ibv_srq_init_attr_ex, comp_mask)),
        ("ibv_srq_init_attr_ex.srq_type", offset_of!(ibv_srq_init_attr_ex, srq_type)),
        ("ibv_srq_init_attr_ex.pd", offset_of!(ibv_srq_init_attr_ex, pd)),
        ("ibv_srq_init_attr_ex.cq", offset_of!(ibv_srq_init_attr_ex, cq)),
        ("ibv_srq_init_attr_ex.tm_cap", offset_of!(ibv_srq_init_attr_ex, tm_cap)),
    ];
    let ours: String = ours.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    assert_eq!(ours, c);
}
