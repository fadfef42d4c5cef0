-- Every visible metric row written by clipcache runs.
{{ visible_rows(source('warehouse', 'metrics')) }}
