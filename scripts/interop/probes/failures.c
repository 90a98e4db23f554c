/* Probe (scripts/rxe-probe): each verb's answer to a bad call, its return value and the errno
   it leaves (errno cleared before each call). */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <infiniband/verbs.h>
#define T(name, call) do { errno = 0; int r_ = (call); int e_ = errno; printf("%-28s r=%d errno=%d\n", name, r_, e_); } while (0)
#define TP(name, call) do { errno = 0; void *p_ = (void *)(call); int e_ = errno; printf("%-28s %s errno=%d\n", name, p_ ? "ok" : "NULL", e_); } while (0)
int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  static struct ibv_sge sg[8];
  struct ibv_device **l = ibv_get_device_list(NULL);
  struct ibv_context *c = ibv_open_device(l[0]);
  struct ibv_pd *pd = ibv_alloc_pd(c);
  struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
  struct ibv_cq *cq = ibv_create_cq(c, 8, NULL, ch, 0);
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
  a.cap.max_send_wr = 4; a.cap.max_recv_wr = 4; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(pd, &a);
  struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  static char buf[4096];
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTS };
  T("modify_qp reset->rts", ibv_modify_qp(qp, &m, IBV_QP_STATE));
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 7 };
  T("modify_qp bad port", ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  struct ibv_srq_attr s = { .srq_limit = 100 };
  T("modify_srq limit>wr", ibv_modify_srq(srq, &s, IBV_SRQ_LIMIT));
  T("destroy_cq in use", ibv_destroy_cq(cq));
  T("dealloc_pd in use", ibv_dealloc_pd(pd));
  T("destroy_comp_channel in use", ibv_destroy_comp_channel(ch));
  T("resize_cq 0", ibv_resize_cq(cq, 0));
  T("resize_cq huge", ibv_resize_cq(cq, 1 << 30));
  struct ibv_port_attr pa;
  T("query_port 9", ibv_query_port(c, 9, &pa));
  union ibv_gid g;
  T("query_gid 5000", ibv_query_gid(c, 1, 5000, &g));
  uint16_t pk;
  T("query_pkey 5", ibv_query_pkey(c, 1, 5, &pk));
  T("req_notify_cq", ibv_req_notify_cq(cq, 0));
  struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
  T("attach_mcast non-UD", ibv_attach_mcast(qp, &g, 0));
  T("detach_mcast non-UD", ibv_detach_mcast(qp, &g, 0));
  T("rereg_mr bad flags", ibv_rereg_mr(mr, 0x80, NULL, NULL, 0, 0));
  struct ibv_recv_wr rw = { .num_sge = 5, .sg_list = sg }, *bad;
  T("post_recv too many sge", ibv_post_recv(qp, &rw, &bad));
  T("post_srq_recv too many sge", ibv_post_srq_recv(srq, &rw, &bad));
  struct ibv_send_wr sw = { .num_sge = 5, .sg_list = sg, .opcode = IBV_WR_SEND }, *sbad;
  T("post_send too many sge", ibv_post_send(qp, &sw, &sbad));
  TP("create_cq 0", ibv_create_cq(c, 0, NULL, NULL, 0));
  TP("create_cq huge", ibv_create_cq(c, 1 << 30, NULL, NULL, 0));
  a.cap.max_send_wr = 1 << 20;
  TP("create_qp huge wr", ibv_create_qp(pd, &a));
  a.cap.max_send_wr = 4; a.qp_type = 99;
  TP("create_qp bad type", ibv_create_qp(pd, &a));
  TP("reg_mr bad access", ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE));
  TP("reg_mr null len", ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE));
  struct ibv_ah_attr aa = { .is_global = 0, .port_num = 1 };
  TP("create_ah no grh", ibv_create_ah(pd, &aa));
  aa.is_global = 1; aa.grh.sgid_index = 5;
  TP("create_ah empty sgid 5", ibv_create_ah(pd, &aa));
  {
    struct ibv_qp_init_attr b = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
    b.cap.max_send_wr = 4; b.cap.max_recv_wr = 4; b.cap.max_send_sge = 1; b.cap.max_recv_sge = 1;
    struct ibv_qp *q2 = ibv_create_qp(pd, &b);
    struct ibv_qp_attr m2 = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    T("modify_qp init", ibv_modify_qp(q2, &m2, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    union ibv_gid g0; ibv_query_gid(c, 1, 0, &g0);
    m2 = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = q2->qp_num,
      .max_dest_rd_atomic = 1, .min_rnr_timer = 12, .ah_attr = { .is_global = 1, .grh = { .dgid = g0, .hop_limit = 9, .sgid_index = 5 }, .port_num = 1 } };
    T("modify_qp rtr empty sgid 5", ibv_modify_qp(q2, &m2, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    m2.ah_attr.grh.sgid_index = 208;
    T("modify_qp rtr sgid 208", ibv_modify_qp(q2, &m2, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    struct ibv_ah_attr a3 = { .is_global = 1, .grh = { .dgid = g0, .sgid_index = 200 }, .port_num = 1 };
    TP("create_ah sgid 200", ibv_create_ah(pd, &a3));
    a3.grh.sgid_index = 255;
    TP("create_ah sgid 255", ibv_create_ah(pd, &a3));
    uint16_t pk2;
    T("query_pkey 0", ibv_query_pkey(c, 1, 0, &pk2));
    T("query_pkey 200", ibv_query_pkey(c, 1, 200, &pk2));
    T("query_pkey port 3", ibv_query_pkey(c, 3, 0, &pk2));
    a.qp_type = 9;
    TP("create_qp xrc send", ibv_create_qp(pd, &a));
    a.qp_type = 0xff;
    TP("create_qp driver", ibv_create_qp(pd, &a));
    a.qp_type = 1;
    TP("create_qp type 1", ibv_create_qp(pd, &a));
    a.qp_type = 7;
    TP("create_qp type 7", ibv_create_qp(pd, &a));
    ibv_destroy_qp(q2);
  }
  T("dealloc_mw", mw ? ibv_dealloc_mw(mw) : -2);
  T("destroy_qp", ibv_destroy_qp(qp));
  T("destroy_srq", ibv_destroy_srq(srq));
  T("dereg_mr", ibv_dereg_mr(mr));
  T("destroy_cq", ibv_destroy_cq(cq));
  T("destroy_comp_channel", ibv_destroy_comp_channel(ch));
  T("dealloc_pd", ibv_dealloc_pd(pd));
  return 0;
}
