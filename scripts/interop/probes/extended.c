/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): the
   extended verbs' answers. Query Device Ex field by field, the GID table through
   ibv_query_gid_ex and ibv_query_gid_table, the device's identity, Create CQ Ex and Create
   QP Ex with each optional flag alone, and what each optional verb a provider may lack
   answers (return value and errno). */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <infiniband/verbs.h>
#define P(...) printf(__VA_ARGS__)
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq *cq;
static void ans(const char *what, const void *obj) { P("%s -> %s errno %d\n", what, obj ? "ok" : "NULL", obj ? 0 : errno); }
static void rc(const char *what, int r) { P("%s -> %d errno %d\n", what, r, r ? errno : 0); }
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  int gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  P("node_type %d transport %d guid_nonzero %d index %d\n", l[0]->node_type, l[0]->transport_type,
    ibv_get_device_guid(l[0]) != 0, ibv_get_device_index(l[0]) >= 0);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); cq = ibv_create_cq(c, 64, NULL, NULL, 0);

  struct ibv_device_attr_ex x; memset(&x, 0xab, sizeof x);
  int r = ibv_query_device_ex(c, NULL, &x);
  struct ibv_device_attr *o = &x.orig_attr;
  P("query_device_ex %d fw_set %d vendor %#x part %u hw %u\n", r, o->fw_ver[0] != 0, o->vendor_id, o->vendor_part_id, o->hw_ver);
  P("max_mr_size %llu page_size_cap %#llx\n", (unsigned long long)o->max_mr_size, (unsigned long long)o->page_size_cap);
  P("qp %d qp_wr %d cap %#x sge %d sge_rd %d cq %d cqe %d mr %d pd %d\n", o->max_qp, o->max_qp_wr, o->device_cap_flags, o->max_sge,
    o->max_sge_rd, o->max_cq, o->max_cqe, o->max_mr, o->max_pd);
  P("qp_rd_atom %d ee_rd_atom %d res_rd_atom %d qp_init_rd_atom %d ee_init_rd_atom %d atomic_cap %d ee %d rdd %d mw %d\n",
    o->max_qp_rd_atom, o->max_ee_rd_atom, o->max_res_rd_atom, o->max_qp_init_rd_atom, o->max_ee_init_rd_atom, o->atomic_cap,
    o->max_ee, o->max_rdd, o->max_mw);
  P("raw_ipv6 %d raw_ethy %d mcg %d mcg_qp %d total_mcg %d ah %d fmr %d map_per_fmr %d srq %d srq_wr %d srq_sge %d pkeys %d ack_delay %d ports %d\n",
    o->max_raw_ipv6_qp, o->max_raw_ethy_qp, o->max_mcast_grp, o->max_mcast_qp_attach, o->max_total_mcast_qp_attach, o->max_ah,
    o->max_fmr, o->max_map_per_fmr, o->max_srq, o->max_srq_wr, o->max_srq_sge, o->max_pkeys, o->local_ca_ack_delay, o->phys_port_cnt);
  P("comp_mask %#x odp %#llx/%#x/%#x/%#x ts_mask %#llx clock %llu cap_ex %#llx\n", x.comp_mask,
    (unsigned long long)x.odp_caps.general_caps, x.odp_caps.per_transport_caps.rc_odp_caps, x.odp_caps.per_transport_caps.uc_odp_caps,
    x.odp_caps.per_transport_caps.ud_odp_caps, (unsigned long long)x.completion_timestamp_mask, (unsigned long long)x.hca_core_clock,
    (unsigned long long)x.device_cap_flags_ex);
  P("tso %u/%#x rss %#x/%u/%u/%#x/%#x wq_rq %u pacing %u/%u/%#x raw %#x\n", x.tso_caps.max_tso, x.tso_caps.supported_qpts,
    x.rss_caps.supported_qpts, x.rss_caps.max_rwq_indirection_tables, x.rss_caps.max_rwq_indirection_table_size,
    (unsigned)x.rss_caps.rx_hash_fields_mask, x.rss_caps.rx_hash_function, x.max_wq_type_rq, x.packet_pacing_caps.qp_rate_limit_min,
    x.packet_pacing_caps.qp_rate_limit_max, x.packet_pacing_caps.supported_qpts, x.raw_packet_caps);
  P("tm %u/%u/%u/%u/%u cq_mod %u/%u dm %llu pci_atomic %u/%u/%u xrc_odp %#x ports_ex %u\n", x.tm_caps.max_rndv_hdr_size,
    x.tm_caps.max_num_tags, x.tm_caps.flags, x.tm_caps.max_ops, x.tm_caps.max_sge, x.cq_mod_caps.max_cq_count,
    x.cq_mod_caps.max_cq_period, (unsigned long long)x.max_dm_size, x.pci_atomic_caps.fetch_add, x.pci_atomic_caps.swap,
    x.pci_atomic_caps.compare_swap, x.xrc_odp_caps, x.phys_port_cnt_ex);
  struct ibv_query_device_ex_input in = { .comp_mask = 1 };
  errno = 0; rc("query_device_ex comp_mask 1", ibv_query_device_ex(c, &in, &x));

  /* The GID table. */
  struct ibv_gid_entry e; memset(&e, 0xab, sizeof e);
  errno = 0; r = ibv_query_gid_ex(c, 1, gi, &e, 0);
  P("gid_ex %d index %u port %u type %d ndev_set %d\n", r, e.gid_index, e.port_num, e.gid_type, e.ndev_ifindex != 0);
  errno = 0; rc("gid_ex flags 1", ibv_query_gid_ex(c, 1, gi, &e, 1));
  errno = 0; rc("gid_ex port 2", ibv_query_gid_ex(c, 2, gi, &e, 0));
  errno = 0; rc("gid_ex index 200", ibv_query_gid_ex(c, 1, 200, &e, 0));
  struct ibv_gid_entry t[64]; memset(t, 0, sizeof t);
  errno = 0; ssize_t n = ibv_query_gid_table(c, t, 64, 0);
  P("gid_table %zd errno %d", n, n < 0 ? errno : 0);
  for (ssize_t i = 0; i < n; i++) if (t[i].gid_index == (unsigned)gi) P(" [entry for index %d: port %u type %d]", gi, t[i].port_num, t[i].gid_type);
  P("\n");
  errno = 0; n = ibv_query_gid_table(c, t, 0, 0); P("gid_table 0 entries %zd errno %d\n", n, n < 0 ? errno : 0);
  struct ibv_port_attr pa; errno = 0; rc("query_port 0", ibv_query_port(c, 0, &pa));
  errno = 0; rc("query_port 2", ibv_query_port(c, 2, &pa));

  /* Create CQ Ex: each completion field alone. */
  static const struct { unsigned long f; const char *n; } wcf[] = {
    { IBV_WC_EX_WITH_BYTE_LEN, "byte_len" }, { IBV_WC_EX_WITH_IMM, "imm" }, { IBV_WC_EX_WITH_QP_NUM, "qp_num" },
    { IBV_WC_EX_WITH_SRC_QP, "src_qp" }, { IBV_WC_EX_WITH_SLID, "slid" }, { IBV_WC_EX_WITH_SL, "sl" },
    { IBV_WC_EX_WITH_DLID_PATH_BITS, "dlid_path_bits" }, { IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, "timestamp" },
    { IBV_WC_EX_WITH_CVLAN, "cvlan" }, { IBV_WC_EX_WITH_FLOW_TAG, "flow_tag" }, { IBV_WC_EX_WITH_TM_INFO, "tm_info" },
    { IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, "wallclock" } };
  for (unsigned k = 0; k < sizeof wcf / sizeof *wcf; k++) {
    struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = wcf[k].f };
    errno = 0; struct ibv_cq_ex *q = ibv_create_cq_ex(c, &ca);
    P("cq_ex %s -> %s errno %d", wcf[k].n, q ? "ok" : "NULL", q ? 0 : errno);
    if (q) { P(" cqe %d", ibv_cq_ex_to_cq(q)->cqe); ibv_destroy_cq(ibv_cq_ex_to_cq(q)); }
    P("\n");
  }
  struct ibv_cq_init_attr_ex ca = { .cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS, .flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
  errno = 0; struct ibv_cq_ex *cqx = ibv_create_cq_ex(c, &ca); ans("cq_ex single_threaded", cqx);
  ca = (struct ibv_cq_init_attr_ex){ .cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS, .flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN };
  errno = 0; cqx = ibv_create_cq_ex(c, &ca); ans("cq_ex ignore_overrun", cqx);
  ca = (struct ibv_cq_init_attr_ex){ .cqe = 16, .comp_mask = 1 << 5 };
  errno = 0; cqx = ibv_create_cq_ex(c, &ca); ans("cq_ex unknown comp_mask", cqx);
  ca = (struct ibv_cq_init_attr_ex){ .cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pd };
  errno = 0; cqx = ibv_create_cq_ex(c, &ca); ans("cq_ex with a pd as parent domain", cqx);
  struct ibv_modify_cq_attr mca = { .attr_mask = IBV_CQ_ATTR_MODERATE, .moderate = { .cq_count = 4, .cq_period = 10 } };
  errno = 0; rc("modify_cq moderate", ibv_modify_cq(cq, &mca));

  /* Create QP Ex: each send operation alone, then the optional creation fields. */
  static const struct { unsigned long f; const char *n; } ops[] = {
    { IBV_QP_EX_WITH_RDMA_WRITE, "write" }, { IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, "write_imm" }, { IBV_QP_EX_WITH_SEND, "send" },
    { IBV_QP_EX_WITH_SEND_WITH_IMM, "send_imm" }, { IBV_QP_EX_WITH_RDMA_READ, "read" }, { IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, "cas" },
    { IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, "faa" }, { IBV_QP_EX_WITH_LOCAL_INV, "local_inv" }, { IBV_QP_EX_WITH_BIND_MW, "bind_mw" },
    { IBV_QP_EX_WITH_SEND_WITH_INV, "send_inv" }, { IBV_QP_EX_WITH_TSO, "tso" } };
  int types[] = { IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD };
  const char *tn[] = { "rc", "uc", "ud" };
  for (unsigned t2 = 0; t2 < 3; t2++)
    for (unsigned k = 0; k < sizeof ops / sizeof *ops; k++) {
      struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = types[t2], .pd = pd,
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .send_ops_flags = ops[k].f,
        .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
      errno = 0; struct ibv_qp *q = ibv_create_qp_ex(c, &a);
      P("qp_ex %s %s -> %s errno %d\n", tn[t2], ops[k].n, q ? "ok" : "NULL", q ? 0 : errno);
      if (q) ibv_destroy_qp(q);
    }
  struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
    .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS, .create_flags = IBV_QP_CREATE_SCATTER_FCS,
    .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
  errno = 0; struct ibv_qp *q = ibv_create_qp_ex(c, &a); ans("qp_ex scatter_fcs", q);
  a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB; errno = 0; q = ibv_create_qp_ex(c, &a); ans("qp_ex block_self_mcast_lb", q);
  if (q) ibv_destroy_qp(q);
  a.create_flags = IBV_QP_CREATE_PCI_WRITE_END_PADDING; errno = 0; q = ibv_create_qp_ex(c, &a); ans("qp_ex pci_write_end_padding", q);
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER; a.create_flags = 0; a.max_tso_header = 64;
  errno = 0; q = ibv_create_qp_ex(c, &a); ans("qp_ex max_tso_header", q);
  a.comp_mask = IBV_QP_INIT_ATTR_PD | (1 << 12); errno = 0; q = ibv_create_qp_ex(c, &a); ans("qp_ex unknown comp_mask", q);
  a.comp_mask = 0; errno = 0; q = ibv_create_qp_ex(c, &a); ans("qp_ex no pd", q);

  /* The optional verbs. */
  struct ibv_td_init_attr ta = { 0 }; errno = 0; struct ibv_td *td = ibv_alloc_td(c, &ta); ans("alloc_td", td);
  struct ibv_parent_domain_init_attr pda = { .pd = pd, .td = td }; errno = 0; ans("alloc_parent_domain", ibv_alloc_parent_domain(c, &pda));
  struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = 0 };
  errno = 0; ans("open_xrcd", ibv_open_xrcd(c, &xa));
  struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 4, .max_sge = 1, .pd = pd, .cq = cq };
  errno = 0; ans("create_wq", ibv_create_wq(c, &wa));
  struct ibv_counters_init_attr cia = { 0 }; errno = 0; ans("create_counters", ibv_create_counters(c, &cia));
  struct ibv_alloc_dm_attr da = { .length = 4096 }; errno = 0; ans("alloc_dm", ibv_alloc_dm(c, &da));
  errno = 0; ans("reg_dmabuf_mr", ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE));
  static char buf[8192] __attribute__((aligned(4096)));
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_sge sg = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
  errno = 0; rc("advise_mr", ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sg, 1));
  struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK }; errno = 0; rc("query_rt_values_ex", ibv_query_rt_values_ex(c, &v));
  struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  struct ibv_ece ece; memset(&ece, 0xab, sizeof ece); errno = 0; r = ibv_query_ece(qp, &ece);
  P("query_ece -> %d errno %d\n", r, r ? errno : 0);
  ece = (struct ibv_ece){ .vendor_id = 0x15b3, .options = 1 }; errno = 0; rc("set_ece", ibv_set_ece(qp, &ece));
  errno = 0; r = ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0); P("data_in_order write -> %d\n", r);
  errno = 0; r = ibv_query_qp_data_in_order(qp, IBV_WR_SEND, 0); P("data_in_order send -> %d\n", r);
  struct ibv_srq_init_attr_ex sx = { .attr = { .max_wr = 4, .max_sge = 1 }, .comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ,
    .srq_type = IBV_SRQT_BASIC, .pd = pd, .cq = cq };
  errno = 0; struct ibv_srq *s = ibv_create_srq_ex(c, &sx); ans("create_srq_ex basic", s);
  uint32_t srqn = 0; if (s) { errno = 0; rc("get_srq_num basic", ibv_get_srq_num(s, &srqn)); }
  sx.srq_type = IBV_SRQT_XRC; errno = 0; ans("create_srq_ex xrc", ibv_create_srq_ex(c, &sx));
  sx.srq_type = IBV_SRQT_TM; sx.comp_mask |= IBV_SRQ_INIT_ATTR_TM; sx.tm_cap.max_num_tags = 4; sx.tm_cap.max_ops = 4;
  errno = 0; ans("create_srq_ex tm", ibv_create_srq_ex(c, &sx));
  struct ibv_flow_attr fa = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof fa, .port = 1 };
  errno = 0; ans("create_flow", ibv_create_flow(qp, &fa));
  errno = 0; ans("import_device(-1)", ibv_import_device(-1));
  errno = 0; ans("import_pd(0)", ibv_import_pd(c, 0));
  errno = 0; ans("import_mr(0)", ibv_import_mr(pd, 0));
  return 0;
}
