/* Asynchronous events through the C ABI: a QP on an SRQ moved to Error raises Last WQE
   Reached naming that QP; once the program acknowledged it, Destroy QP returns (libibverbs'
   destroy waits for the acknowledgements of the events it handed out). An alarm is a hang
   guard only. Prints "async_events: ok". */
#define TEST_NAME "async_events"
#include "verbs_test.h"

int main(void)
{
	hang_guard(20);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(ctx, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(pd && cq && srq, "pd, cq, srq");
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
					 .cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp, "ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "ERR");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp, "event %d (%s) for %p",
	      ev.event_type, ibv_event_type_str(ev.event_type), (void *)ev.element.qp);
	ibv_ack_async_event(&ev);
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_srq(srq) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0, "teardown");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("async_events: ok\n");
	return 0;
}
