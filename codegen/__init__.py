"""Program <-> bytes: SG2260 TIU/GDMA descriptors, LinxISA CUBE blocks, output files, disassembly."""

from tpuflow.codegen.disasm import instruction_line, path_lines, program_lines
from tpuflow.codegen.linx import decode_blocks, encode_block, encode_blocks
from tpuflow.codegen.sg2260 import decode_descriptors, descriptor_form, encode_descriptor, encode_descriptors
from tpuflow.codegen.writer import decode_stream, encode_stream, read_program, write_program

__all__ = ["decode_blocks", "decode_descriptors", "decode_stream", "descriptor_form", "encode_block",
           "encode_blocks", "encode_descriptor", "encode_descriptors", "encode_stream", "instruction_line",
           "path_lines", "program_lines", "read_program", "write_program"]
