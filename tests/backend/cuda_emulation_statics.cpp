// Where the kernels' static `__shared__` variables are, so that the emulator can fill them with
// junk before each block (cuda_emulation.h). They are function-local statics (`__shared__` is
// `static` there), which C++ gives no common home: a named section would gather those of plain
// functions, but GCC 12 ignores it on function templates' (each instance has a COMDAT section of
// its own). The program's symbol table names them all instead: a function-local static is
// mangled "_ZZ...", and a zero-initialized one lives in .bss. Those of internal linkage are
// listed under their source file's name, and only the kernels' files count
// (cuda_emulated_kernels.cpp, a test_cuda_*.cpp): the emulated NCCL's and runtime's own statics
// live beside them. Those of external linkage carry no file, and count unless they are the
// emulator's (namespace emu): a host function with external linkage and a zero-initialized
// static must not be compiled into an emulated program, or it would read as 0xFF bytes.
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include <vector>

namespace emu {
namespace {

struct byte_range {
    unsigned char *at;
    size_t bytes;
};

// The load address of the program itself (position-independent executables move).
int note_program_base(struct dl_phdr_info *info, size_t, void *base) {
    *static_cast<ElfW(Addr) *>(base) = info->dlpi_addr;
    return 1; // the first object listed is the program
}

std::vector<unsigned char> read_program() {
    std::vector<unsigned char> image;
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return image;
    unsigned char chunk[1 << 16];
    for (size_t n; (n = fread(chunk, 1, sizeof chunk, f)) > 0;)
        image.insert(image.end(), chunk, chunk + n);
    fclose(f);
    return image;
}

// A function-local static found in the symbol table, by the rules above: internal linkage in a
// kernels' file, or external linkage outside namespace emu.
bool kernel_static(const char *name, unsigned char binding, const char *file) {
    if (strncmp(name, "_ZZ", 3) != 0) return false;
    if (binding != STB_LOCAL) return strncmp(name, "_ZZN3emu", 8) != 0;
    return strncmp(file, "cuda_emulated_kernels.", 22) == 0 ||
           strncmp(file, "test_cuda_", 10) == 0;
}

// Every zero-initialized function-local static of the kernels: the symbol table's objects in a
// writable section without file contents (.bss) that kernel_static takes. A stripped program
// has no symbol table, and then nothing is found (the kernel test checks that some are).
std::vector<byte_range> find_kernel_statics() {
    std::vector<byte_range> found;
    std::vector<unsigned char> image = read_program();
    if (image.size() < sizeof(ElfW(Ehdr))) return found;
    const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(image.data());
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_shoff == 0 ||
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) > image.size())
        return found;
    const auto *sections = reinterpret_cast<const ElfW(Shdr) *>(image.data() + eh->e_shoff);
    ElfW(Addr) base = 0;
    dl_iterate_phdr(note_program_base, &base);
    for (int s = 0; s < eh->e_shnum; s++) {
        const ElfW(Shdr) &symtab = sections[s];
        if (symtab.sh_type != SHT_SYMTAB || symtab.sh_link >= eh->e_shnum) continue;
        const char *names = reinterpret_cast<const char *>(image.data()) +
                            sections[symtab.sh_link].sh_offset;
        const auto *syms = reinterpret_cast<const ElfW(Sym) *>(image.data() + symtab.sh_offset);
        size_t count = symtab.sh_size / sizeof(ElfW(Sym));
        const char *file = ""; // the source file whose local symbols follow
        for (size_t i = 0; i < count; i++) {
            const ElfW(Sym) &sym = syms[i];
            const char *name = names + sym.st_name;
            if (ELF64_ST_TYPE(sym.st_info) == STT_FILE) file = name;
            if (ELF64_ST_TYPE(sym.st_info) != STT_OBJECT || sym.st_size == 0 ||
                sym.st_shndx == SHN_UNDEF || sym.st_shndx >= eh->e_shnum)
                continue;
            const ElfW(Shdr) &home = sections[sym.st_shndx];
            if (home.sh_type != SHT_NOBITS || !(home.sh_flags & SHF_WRITE) ||
                !kernel_static(name, ELF64_ST_BIND(sym.st_info), file))
                continue;
            found.push_back({reinterpret_cast<unsigned char *>(base + sym.st_value),
                             (size_t)sym.st_size});
        }
    }
    return found;
}

const std::vector<byte_range> &kernel_statics() {
    static const std::vector<byte_range> statics = find_kernel_statics();
    return statics;
}

} // namespace

void poison_static_smem() {
    for (const byte_range &r : kernel_statics()) memset(r.at, 0xFF, r.bytes);
}

size_t static_smem_variables() { return kernel_statics().size(); }

} // namespace emu
