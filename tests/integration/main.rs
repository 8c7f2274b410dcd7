//! Integration tests: run the real binary in temporary folders.

mod util;

mod agent;
mod batch;
mod bundle_cmd;
mod config_cmd;
mod crash;
mod delivery;
mod disk_full;
mod failed_spool;
mod failpoints;
mod hostile;
mod hostile3;
mod lab;
mod maintain;
mod manpage;
mod matrix;
mod metrics;
mod operate;
mod outage;
mod producer;
mod producer_limits;
mod producer_spool;
mod race;
mod reliability;
mod render;
mod run;
mod s3;
mod s3_batch;
mod s3_hostile;
mod s3_maintain;
mod s3_publish;
mod s3_race;
mod seaweed;
mod signatures;
mod unchanged;
