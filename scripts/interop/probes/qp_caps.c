/* Probe (scripts/rxe-probe): the send capacities Create QP writes back for RC and UD QPs
   asking for various SGE and inline sizes, and what Query QP reports. */
#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
  struct ibv_device **l = ibv_get_device_list(NULL);
  struct ibv_context *c = ibv_open_device(l[0]);
  struct ibv_pd *pd = ibv_alloc_pd(c);
  struct ibv_cq *cq = ibv_create_cq(c, 64, NULL, NULL, 0);
  struct ibv_device_attr da; ibv_query_device(c, &da);
  printf("max_sge %d\n", da.max_sge);
  int t[] = {IBV_QPT_RC, IBV_QPT_UD};
  int sg[][2] = {{1,0},{1,16},{1,17},{1,64},{2,0},{4,0},{0,0},{3,40},{1,200},{1,512},{32,0},{1,513},{30,490}};
  for (int k = 0; k < 2; k++)
  for (unsigned i = 0; i < sizeof sg / sizeof sg[0]; i++) {
    struct ibv_qp_init_attr a = {0};
    a.send_cq = a.recv_cq = cq; a.qp_type = t[k];
    a.cap.max_send_wr = 4; a.cap.max_recv_wr = 4; a.cap.max_send_sge = sg[i][0]; a.cap.max_recv_sge = sg[i][0];
    a.cap.max_inline_data = sg[i][1];
    struct ibv_qp *q = ibv_create_qp(pd, &a);
    struct ibv_qp_attr qa; struct ibv_qp_init_attr qi;
    int qr = q ? ibv_query_qp(q, &qa, IBV_QP_CAP, &qi) : -1;
    printf("type %d req sge %d inline %d -> %s sge %u/%u inline %u wr %u/%u | query sge %u inline %u\n", t[k], sg[i][0], sg[i][1],
      q ? "ok" : "FAIL", a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data, a.cap.max_send_wr, a.cap.max_recv_wr,
      qr ? 0 : qa.cap.max_send_sge, qr ? 0 : qa.cap.max_inline_data);
    if (q) ibv_destroy_qp(q);
  }
  return 0;
}
