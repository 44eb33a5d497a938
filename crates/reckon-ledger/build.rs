// `sqlx::migrate!` embeds the migrations at compile time; without this, a migration added
// or edited alone would not rebuild the crate, and an incremental build would run the old set.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
