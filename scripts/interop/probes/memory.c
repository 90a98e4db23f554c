/* Probe (scripts/rxe-probe): ibv_reg_mr's answers to access-flag combinations and ranges,
   ibv_rereg_mr's to each of its flags, and memory windows' allocation and binds. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>
#define TP(name, call) do { errno = 0; void *p_ = (void *)(call); int e_ = errno; printf("%-44s %s errno=%d\n", name, p_ ? "ok" : "NULL", e_); } while (0)
#define T(name, call) do { errno = 0; int r_ = (call); int e_ = errno; printf("%-44s r=%d errno=%d\n", name, r_, e_); } while (0)
int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  struct ibv_device **l = ibv_get_device_list(NULL);
  struct ibv_context *c = ibv_open_device(l[0]);
  struct ibv_pd *pd = ibv_alloc_pd(c), *pd2 = ibv_alloc_pd(c);
  char *buf = aligned_alloc(4096, 1 << 16); memset(buf, 0, 1 << 16);
  static const struct { const char *n; int a; } acc[] = {
    { "none", 0 }, { "local write", IBV_ACCESS_LOCAL_WRITE }, { "remote read", IBV_ACCESS_REMOTE_READ },
    { "remote write w/o local write", IBV_ACCESS_REMOTE_WRITE }, { "remote atomic w/o local write", IBV_ACCESS_REMOTE_ATOMIC },
    { "remote write + local write", IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE },
    { "mw bind", IBV_ACCESS_MW_BIND }, { "zero based", IBV_ACCESS_ZERO_BASED }, { "on demand", IBV_ACCESS_ON_DEMAND },
    { "hugetlb", IBV_ACCESS_HUGETLB }, { "relaxed ordering", IBV_ACCESS_RELAXED_ORDERING },
    { "unknown bit 1<<29", 1 << 29 },
  };
  for (unsigned i = 0; i < sizeof acc / sizeof *acc; i++) {
    char n[64]; snprintf(n, sizeof n, "reg_mr %s", acc[i].n);
    struct ibv_mr *m; errno = 0; m = ibv_reg_mr(pd, buf, 4096, acc[i].a); int e = errno;
    printf("%-44s %s errno=%d\n", n, m ? "ok" : "NULL", e);
    if (m) ibv_dereg_mr(m);
  }
  TP("reg_mr length 0", ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE));
  TP("reg_mr unaligned 1 byte", ibv_reg_mr(pd, buf + 7, 1, IBV_ACCESS_LOCAL_WRITE));
  void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TP("reg_mr read-only, local write", ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_LOCAL_WRITE));
  TP("reg_mr read-only, remote read", ibv_reg_mr(pd, ro, 4096, IBV_ACCESS_REMOTE_READ));
  TP("reg_mr_iova other iova", ibv_reg_mr_iova(pd, buf, 4096, 0x10000, IBV_ACCESS_LOCAL_WRITE));
  struct ibv_mr *m = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
  printf("lkey==rkey %d length %zu\n", m->lkey == m->rkey, m->length);
  T("rereg_mr no flags", ibv_rereg_mr(m, 0, NULL, NULL, 0, 0));
  T("rereg_mr change pd", ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0));
  printf("  pd now pd2 %d\n", m->pd == pd2);
  T("rereg_mr change access remote write", ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  T("rereg_mr change access bad", ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE));
  T("rereg_mr change translation", ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf + 4096, 4096, 0));
  printf("  addr moved %d length %zu\n", m->addr == buf + 4096, m->length);
  T("rereg_mr translation len 0", ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf, 0, 0));
  T("rereg_mr unknown flag", ibv_rereg_mr(m, 1 << 5, NULL, NULL, 0, 0));
  T("dereg_mr", ibv_dereg_mr(m));
  TP("alloc_mw type 1", ibv_alloc_mw(pd, IBV_MW_TYPE_1));
  TP("alloc_mw type 2", ibv_alloc_mw(pd, IBV_MW_TYPE_2));
  TP("alloc_mw type 3", ibv_alloc_mw(pd, 3));
  struct ibv_cq *cq = ibv_create_cq(c, 16, NULL, NULL, 0);
  struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
  struct ibv_qp *qp = ibv_create_qp(pd, &qa);
  struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
  struct ibv_mr *bm = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  struct ibv_mr *nb = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mw_bind b = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED, .bind_info = { .mr = bm, .addr = (uintptr_t)buf, .length = 4096, .mw_access_flags = IBV_ACCESS_REMOTE_READ } };
  T("bind_mw on a Reset QP", ibv_bind_mw(qp, mw1, &b));
  struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
  ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  T("bind_mw on an Init QP", ibv_bind_mw(qp, mw1, &b));
  b.bind_info.mr = nb;
  T("bind_mw region without MW_BIND", ibv_bind_mw(qp, mw1, &b));
  b.bind_info.mr = bm; b.bind_info.mw_access_flags = IBV_ACCESS_ZERO_BASED;
  T("bind_mw zero based", ibv_bind_mw(qp, mw1, &b));
  struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  T("bind_mw of a type 2 window", ibv_bind_mw(qp, mw2, &b));
  T("dealloc_mw type 1", ibv_dealloc_mw(mw1));
  T("dereg_mr bound region", ibv_dereg_mr(bm));
  return 0;
}
