"""Report stage: dbt builds the marts over the Parquet results; a static HTML page is rendered from them."""
