-- FairFace / UTKFace head metrics per dataset (var `face_definitions`): the head, the outcome rule (equals,
-- not_class, range), its class / bounds / truth field, and the one or two fields it groups by.
{{ face_definitions_table() }}
