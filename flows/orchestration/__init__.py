"""Running the stages: the pipelines (pipeline, conversion, reporting), how each stage is called (stages, scaleout),
local calls or a Prefect flow run (launch, prefect_server, runtime), the Prefect flows (flows: every flow is defined
there), their artifacts and the deployments. Imports config/, never cli/."""
