//! Protection domains (device tests).

mod common;

#[test]
#[ignore = "needs an RDMA device"]
fn alloc_and_close() {
    let t = common::device();
    let pd = t.ctx.alloc_pd().unwrap();
    assert!(std::ptr::eq(pd.context().as_ptr(), t.ctx.as_ptr()));
    let other = pd.clone();
    assert!(!pd.close().unwrap(), "another handle exists");
    assert!(other.close().unwrap(), "last handle deallocates");
}

#[test]
#[ignore = "needs an RDMA device"]
fn children_keep_parents_alive_in_any_drop_order() {
    let t = common::device();
    let ctx = t.ctx.clone();
    let pd = ctx.alloc_pd().unwrap();
    let buf = pd
        .register(vec![7u8; 4096], rdma_verbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    let cq = ctx.create_cq(256).build().unwrap();
    let qp = pd
        .create_qp(rdma_verbs::QpType::Rc, &cq, &cq)
        .build()
        .unwrap();
    // Drop parents first: the children still work.
    drop(pd);
    drop(cq);
    drop(ctx);
    drop(t);
    assert_eq!(buf[0], 7);
    assert!(qp.qp_num().0 > 0);
    assert!(qp.pd().context().query_device().unwrap().phys_port_cnt() >= 1);
    drop(qp);
    drop(buf);
}
