//! A glommio application embedding omnibus: its own executors (separate from the engine's)
//! send messages to storage actors through `StorageHandle`'s async methods, then read back.
//! The engine's actors run on the engine's executors, never on the application's: glommio
//! cannot place a task on an executor from outside it, and the actors need executors set up
//! as `Engine::start` sets them up (README, "Embedding").
//!
//! Run: `cargo run --release --example glommio_app -- [puts per executor]` (default 2,000).

use glommio::{LocalExecutorBuilder, Placement};
use omnibus::actors::{Engine, EngineOptions, WriteBatch};
use omnibus::Options;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per: u32 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })?;
    let db = engine.blocking_open_database(dir.path().join("app"), Options::default())?;
    let started = std::time::Instant::now();
    let mut apps = Vec::new();
    for a in 0..2u32 {
        let db = db.clone();
        let h = LocalExecutorBuilder::new(Placement::Unbound)
            .name(&format!("app-{a}"))
            .spawn(move || async move {
                let users = db.create_storage("users").await?;
                let by_age = db.create_storage("users_by_age").await?;
                // Many concurrent tasks on this executor, each awaiting its own durable writes.
                let mut tasks = Vec::new();
                for t in 0..16u32 {
                    let (users, by_age) = (users.clone(), by_age.clone());
                    tasks.push(glommio::spawn_local(async move {
                        for i in (t..per).step_by(16) {
                            let id = format!("user-{a}-{i:06}");
                            users
                                .put(id.clone(), format!("{{\"age\":{}}}", i % 90))
                                .await?;
                            let mut b = WriteBatch::new();
                            b.put(format!("{:03}/{id}", i % 90), "");
                            by_age.write(b).await?;
                        }
                        Ok::<_, omnibus::Error>(())
                    }));
                }
                for t in tasks {
                    t.await?;
                }
                let got = users.get(format!("user-{a}-000007")).await?;
                assert_eq!(got.as_deref(), Some(&b"{\"age\":7}"[..]));
                Ok::<_, omnibus::Error>(())
            })?;
        apps.push(h);
    }
    for h in apps {
        h.join()
            .map_err(|e| std::io::Error::other(format!("{e:?}")))??;
    }
    let users = db.blocking_create_storage("users")?;
    let by_age = db.blocking_create_storage("users_by_age")?;
    let n_users = users.snapshot()?.len();
    let n_index = by_age.snapshot()?.len();
    assert_eq!(n_users, 2 * per as u64);
    assert_eq!(n_index, 2 * per as u64);
    let teens = by_age
        .blocking_range((
            std::ops::Bound::Included(&b"013/"[..]),
            std::ops::Bound::Excluded(&b"014/"[..]),
        ))?
        .collect::<omnibus::Result<Vec<_>>>()?;
    assert!(!teens.is_empty());
    let st = db.stats();
    println!(
        "glommio_app: {} users and {} index entries from 2 glommio executors in {:.2} s; {} commits in {} batches ({:.1} per fdatasync)",
        n_users,
        n_index,
        started.elapsed().as_secs_f64(),
        st.commits,
        st.batches,
        st.commits_per_batch
    );
    drop(db);
    engine.shutdown()?;
    Ok(())
}
