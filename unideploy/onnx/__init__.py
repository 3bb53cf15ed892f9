"""ONNX helpers every stage uses: the files (weights inline or beside), the graph's wiring, the
interface a package's signature declares, unideploy's own CPU sessions, and ONNX Runtime's
dynamic INT8 made float again. Below the stages: exporters, optimizers, targets and the guard
import them; they import nothing of those."""
