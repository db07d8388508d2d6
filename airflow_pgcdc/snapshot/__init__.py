"""The initial copy of the source: an exported-snapshot copy to Parquet, or a physical BASE_BACKUP, to S3."""
