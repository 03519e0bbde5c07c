//! How every bench runs: on two worker threads (the cores of the machine the figures are
//! measured on), with the TLS provider that reqwest, built without one, needs.

pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    zkgate::install_crypto_provider();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}
