"""Artefacts and exports: the one reader (every file verified against the manifest, the manifest's fields and kind
checked, the target compared), the writer of manifests and weights, each method's artefact loader beside its exporter
to the serving engines' layouts, and ``draftsmith export``'s dispatcher over the registry's export formats."""
