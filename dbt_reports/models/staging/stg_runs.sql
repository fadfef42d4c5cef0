-- Every visible run row.
{{ visible_rows(source('warehouse', 'runs')) }}
