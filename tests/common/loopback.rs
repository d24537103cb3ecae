//! An HTTP server on loopback, on a thread and runtime of its own: file
//! mode fetches on its own runtime, which cannot nest in a test's, and the
//! binary under test fetches from the test's network namespace. Included
//! with `#[path]` by tests/cli_netns.rs and by the unit tests of
//! `crates/filemode/src/files/sources.rs`.

/// Serve `app` on 127.0.0.1 (a free port) until the process ends; returns
/// its address once it listens.
pub fn serve(app: axum::Router) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}
