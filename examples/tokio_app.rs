//! A tokio application embedding omnibus: a tiny line-based key-value service on loopback TCP
//! (`PUT key value`, `GET key`, `DEL key`) whose connection tasks talk to storage actors through
//! `StorageHandle`, and a client loop that drives it and checks every answer.
//!
//! Run: `cargo run --release --example tokio_app -- [requests] [clients]` (defaults 2,000 and 8).

use std::time::Instant;

use omnibus::actors::{Engine, EngineOptions, StorageHandle};
use omnibus::Options;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

async fn serve(listener: TcpListener, store: StorageHandle) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        let store = store.clone();
        tokio::spawn(async move {
            let (r, mut w) = sock.into_split();
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut parts = line.splitn(3, ' ');
                let reply = match (parts.next(), parts.next(), parts.next()) {
                    (Some("PUT"), Some(k), Some(v)) => match store.put(k, v).await {
                        Ok(()) => "OK".to_string(),
                        Err(e) => format!("ERR {e}"),
                    },
                    (Some("GET"), Some(k), None) => match store.get(k).await {
                        Ok(Some(v)) => format!("VAL {}", String::from_utf8_lossy(&v)),
                        Ok(None) => "NONE".to_string(),
                        Err(e) => format!("ERR {e}"),
                    },
                    (Some("DEL"), Some(k), None) => match store.delete(k).await {
                        Ok(found) => format!("DELETED {found}"),
                        Err(e) => format!("ERR {e}"),
                    },
                    _ => "ERR bad request".to_string(),
                };
                if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn client(addr: std::net::SocketAddr, id: usize, requests: usize) -> Result<(), String> {
    let sock = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    let mut ask = async |req: String| -> Result<String, String> {
        w.write_all(format!("{req}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "closed".to_string())
    };
    for i in 0..requests {
        let (k, v) = (format!("c{id}-k{i}"), format!("value-{id}-{i}"));
        let got = ask(format!("PUT {k} {v}")).await?;
        if got != "OK" {
            return Err(format!("PUT {k}: {got}"));
        }
        let got = ask(format!("GET {k}")).await?;
        if got != format!("VAL {v}") {
            return Err(format!("GET {k}: {got}"));
        }
        if i % 10 == 0 {
            let got = ask(format!("DEL {k}")).await?;
            if got != "DELETED true" {
                return Err(format!("DEL {k}: {got}"));
            }
            let got = ask(format!("GET {k}")).await?;
            if got != "NONE" {
                return Err(format!("GET deleted {k}: {got}"));
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let requests: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let clients: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(8);
    let dir = tempfile::tempdir()?;
    let engine = Engine::start(EngineOptions::default())?;
    let db = engine.blocking_open_database(dir.path().join("kv"), Options::default())?;
    let store = db.blocking_create_storage("kv")?;
    let rt = tokio::runtime::Runtime::new()?;
    let per = requests.div_ceil(clients);
    let started = Instant::now();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(serve(listener, store.clone()));
        let tasks: Vec<_> = (0..clients)
            .map(|c| tokio::spawn(client(addr, c, per)))
            .collect();
        for t in tasks {
            t.await?.map_err(std::io::Error::other)?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    let st = db.stats();
    println!(
        "tokio_app: {} clients x {per} durable PUT+GET round trips over TCP in {secs:.2} s ({:.0} puts/s); {} commits in {} batches; all answers checked",
        clients,
        (clients * per) as f64 / secs,
        st.commits,
        st.batches
    );
    drop(db);
    engine.shutdown()?;
    Ok(())
}
