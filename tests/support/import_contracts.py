"""An import-linter contract type that import-linter does not ship: an allow-list.

``allowed_imports``: the modules under ``source_modules`` may import only their own package, the modules named in
``allowed`` (with their sub-modules) and, with ``allow_standard_library``, Python's standard library. pyproject.toml
uses it for the model's Hub files (torch, transformers, safetensors and the standard library), which run on machines
where only those are promised; a forbidden list cannot say that (``import scipy`` passes every list that does not
name scipy). Registered in pyproject.toml's ``[tool.importlinter] contract_types``; ``python -m tests.support.layers`` runs
``lint-imports`` where it imports as ``tests.support.import_contracts``.
"""

from __future__ import annotations

import sys

from importlinter import Contract, ContractCheck, fields, output


class AllowedImportsContract(Contract):
    type_name = "allowed_imports"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed = fields.ListField(subfield=fields.StringField())
    allow_standard_library = fields.BooleanField(required=False, default=True)

    def _allowed(self, imported: str, own_root: str) -> bool:
        top = imported.split(".")[0]
        if top == own_root or top in {name.split(".")[0] for name in self.allowed}:
            return True
        return bool(self.allow_standard_library) and top in sys.stdlib_module_names

    def check(self, graph, verbose: bool) -> ContractCheck:
        broken = []
        for source in self.source_modules:
            root = source.name.split(".")[0]
            for importer in sorted({source.name} | graph.find_descendants(source.name)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if self._allowed(imported, root):
                        continue
                    for detail in graph.get_import_details(importer=importer, imported=imported):
                        broken.append({"importer": importer, "imported": imported,
                                       "line_number": detail["line_number"], "line": detail["line_contents"]})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(self.allowed) + (" and the standard library" if self.allow_standard_library else "")
        for item in check.metadata["broken"]:
            output.print_error(f"{item['importer']} is not allowed to import {item['imported']} "
                               f"(only {allowed}):")
            output.print_error(f"-   l.{item['line_number']}: {item['line']}", bold=False)
            output.new_line()
