"""Artefacts and exports: the manifest (written, read, checked against the target), each method's artefact loader
beside its exporter to the serving engines' layouts, and ``draftsmith export``'s dispatcher over the registry's
export formats."""
