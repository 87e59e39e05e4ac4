# Two edits to the llama.cpp that llama-cpp-sys-2 builds: fused attention
# for prefill only (`--flash-attn prefill`), a flash-attention policy
# llama.cpp does not have; and ggml-cpu's fused kernel computing steps
# below 64 rows with a kernel of ours, each row the same whatever rows
# share its step, so drafted output stays exact with it (below).
#
# Why: on the CPU, ggml's fused attention kernel prefills faster than the
# unfused one (1.4x on a fresh 3,000-token prompt), but decodes slower
# (a one-position step pays more for every token of context), and it adds
# up a one-position step in another order than a step of several (the
# second edit below removes that difference). The new policy runs each
# graph of at least PREFILL_FROM query rows fused and every smaller one
# (decode steps, drafted steps) unfused, over one KV cache.
#
# How: .cargo/config.toml names this file as CMAKE_PROJECT_INCLUDE, which
# llama-cpp-sys-2 hands to CMake; CMake includes it after each project()
# call. At the end of llama.cpp's top-level CMakeLists, three of the
# `llama` library's sources and one of `ggml-cpu`'s are replaced by copies
# in the build folder with the edits below; the crate's own files are never
# written. Each edit must find its text exactly once, or the configure step
# fails, naming it: a new llama-cpp-sys-2 is then a deliberate update of
# this file. The Makefile rebuilds a llama.cpp configured with another
# version of this file or of flash-attn-rows.cpp (it compares the hash
# written below); plain cargo does not notice an edit.
#
# What the policy is, in llama.cpp's terms:
# - llama_context_params.flash_attn_type = 2, which the patched library's
#   skillhost_flash_attn_for_prefill() returns.
# - The context creates its KV cache as for flash attention off (V stored
#   transposed, the layout the unfused kernels read without a copy), then
#   turns flash attention on for graph building.
# - build_attn_mha runs the fused kernel only when the V cache is transposed
#   and the graph holds at least PREFILL_FROM query rows per stream, copying
#   V into the row layout the fused kernel reads (one copy per layer per
#   graph: small beside a prefill's work). Fewer rows take the unfused path,
#   with the f16 mask flash attention makes (softmax reads f16 and f32 masks
#   alike; the mask's 0 and -inf are exact in both).
# PREFILL_FROM is 64 (the engine's PREFILL_FUSED_FROM_ROWS), ggml-cpu's
# GGML_FA_TILE_Q: from there its fused kernel runs tiled, which is where it
# is fast. A drafted step holds at most 17 (asserted in engine/src/load.rs).
#
# The second edit is to ggml-cpu's fused kernel itself (ops.cpp), and keeps
# drafted output exact with fused decode steps too (`auto`, `on`). Checking
# a draft must give each position the logits a step of that position alone
# would. ggml computes a step of one query row over 512 cells or more by
# splitting the cells across threads and merging the parts, and a step of 2
# to 63 rows row by row, each row whole: a drafted step's first row would be
# added up in another order than the same position decoded alone, and
# greedy output could change where two tokens nearly tie. The edit turns the
# split off, and runs every step below 64 rows through
# flash-attn-rows.cpp (inserted into ops.cpp), which computes a row the same
# whatever else its step holds, and takes the rows of a head together, each
# block of cells widened once for all of them (that file says how). Where
# that kernel does not apply (no AVX2, another K or V type), ggml's row by
# row code runs, split off. Figures: docs/deployment.md.

if(NOT PROJECT_NAME STREQUAL "llama.cpp" OR SKILLHOST_LLAMA_PATCH_DEFERRED)
    return()
endif()
set(SKILLHOST_LLAMA_PATCH_DEFERRED ON)
set(SKILLHOST_LLAMA_PATCH_FILE "${CMAKE_CURRENT_LIST_FILE}")
get_filename_component(skillhost_patch_dir "${CMAKE_CURRENT_LIST_FILE}" DIRECTORY)
file(READ "${skillhost_patch_dir}/flash-attn-rows.cpp" SKILLHOST_FA_ROWS)
# CMake then configures again when the kernel changes, as for this file.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${skillhost_patch_dir}/flash-attn-rows.cpp")

function(skillhost_edit text_var file before after)
    string(FIND "${${text_var}}" "${before}" at)
    if(at EQUAL -1)
        message(FATAL_ERROR "skillhost's llama.cpp patch: ${file} no longer holds:\n${before}\nUpdate engine/llama-patch/patch.cmake for this llama.cpp.")
    endif()
    string(REPLACE "${before}" "${after}" edited "${${text_var}}")
    set(${text_var} "${edited}" PARENT_SCOPE)
endfunction()

# Replaces each of `target`'s sources listed after `out` (as the target
# lists them) by its edited copy in `out`, named with its slashes as dashes;
# the other sources are made absolute, as the target is now edited from
# another directory than the one that made it.
function(skillhost_use_copies target out)
    get_target_property(sources ${target} SOURCES)
    get_target_property(dir ${target} SOURCE_DIR)
    set(copies ${ARGN})
    set(patched "")
    foreach(source IN LISTS sources)
        if(source IN_LIST copies)
            string(REPLACE "/" "-" copy "${source}")
            list(APPEND patched "${out}/${copy}")
            list(REMOVE_ITEM copies "${source}")
        elseif(IS_ABSOLUTE "${source}")
            list(APPEND patched "${source}")
        else()
            list(APPEND patched "${dir}/${source}")
        endif()
    endforeach()
    if(copies)
        message(FATAL_ERROR "skillhost's llama.cpp patch: target ${target} no longer lists ${copies}\nUpdate engine/llama-patch/patch.cmake for this llama.cpp.")
    endif()
    set_property(TARGET ${target} PROPERTY SOURCES "${patched}")
endfunction()

function(skillhost_patch_llama)
    set(src "${CMAKE_SOURCE_DIR}/src")
    set(out "${CMAKE_BINARY_DIR}/skillhost-llama-src")
    file(MAKE_DIRECTORY "${out}")

    # llama.cpp: the policy's name in the context's log (an unknown value
    # aborts there).
    file(READ "${src}/llama.cpp" text)
    skillhost_edit(text llama.cpp
        "        case LLAMA_FLASH_ATTN_TYPE_ENABLED:\n            return \"enabled\";\n"
        "        case LLAMA_FLASH_ATTN_TYPE_ENABLED:\n            return \"enabled\";\n        case (enum llama_flash_attn_type) 2:\n            return \"for prefill (skillhost)\";\n")
    # A symbol only the patched build has: the engine calls it for the
    # policy's value, so it cannot link against a llama.cpp without the
    # policy (which would take the value 2 for "on", and abort naming it).
    string(APPEND text "\n// skillhost: see engine/llama-patch/patch.cmake.\nextern \"C\" LLAMA_API enum llama_flash_attn_type skillhost_flash_attn_for_prefill(void) {\n    return (enum llama_flash_attn_type) 2;\n}\n")
    file(WRITE "${out}/llama.cpp" "${text}")

    # llama-context.cpp: the cache is made as for flash attention off, then
    # graphs are built with it on.
    file(READ "${src}/llama-context.cpp" text)
    skillhost_edit(text llama-context.cpp
        "    cparams.flash_attn = params.flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED;\n"
        "    cparams.flash_attn = params.flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED && params.flash_attn_type != (enum llama_flash_attn_type) 2;\n")
    skillhost_edit(text llama-context.cpp
        "        memory.reset(model.create_memory(params_mem, cparams));\n    }\n"
        "        memory.reset(model.create_memory(params_mem, cparams));\n    }\n    if (params.flash_attn_type == (enum llama_flash_attn_type) 2) {\n        cparams.flash_attn = true;\n    }\n")
    file(WRITE "${out}/llama-context.cpp" "${text}")

    # llama-graph.cpp: fused only for prefill-sized graphs over a transposed
    # V cache; V copied into rows for it.
    file(READ "${src}/llama-graph.cpp" text)
    skillhost_edit(text llama-graph.cpp
        "    const bool use_flash_attn = cparams.flash_attn && kq_b == nullptr;\n"
        "    const bool use_flash_attn = cparams.flash_attn && kq_b == nullptr && (!v_trans || q->ne[1] >= 64);\n")
    skillhost_edit(text llama-graph.cpp
        "        if (v_trans) {\n            v = ggml_transpose(ctx0, v);\n        }\n"
        "        if (v_trans) {\n            v = ggml_cont(ctx0, ggml_transpose(ctx0, v));\n        }\n")
    file(WRITE "${out}/llama-graph.cpp" "${text}")

    skillhost_use_copies(llama "${out}" llama.cpp llama-context.cpp llama-graph.cpp)
    # As llama.cpp's own CMakeLists does for its core sources.
    set_source_files_properties("${out}/llama.cpp" "${out}/llama-context.cpp" "${out}/llama-graph.cpp"
        DIRECTORY "${src}" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

    # ggml-cpu's ops.cpp: no split of a one-row step's cells across threads,
    set(ggml_cpu_ops "ggml-cpu/ops.cpp")
    if(NOT TARGET ggml-cpu)
        message(FATAL_ERROR "skillhost's llama.cpp patch: no target ggml-cpu (one CPU backend, no variants, is expected)\nUpdate engine/llama-patch/patch.cmake for this llama.cpp.")
    endif()
    get_target_property(ggml_src ggml-cpu SOURCE_DIR)
    file(READ "${ggml_src}/${ggml_cpu_ops}" text)
    skillhost_edit(text ggml-cpu/ops.cpp
        "q->type == GGML_TYPE_F32 && nek1 >= 512;"
        "q->type == GGML_TYPE_F32 && nek1 >= 512 && false; // skillhost: every row whole (engine/llama-patch/patch.cmake)")
    # and steps below 64 rows through flash-attn-rows.cpp.
    skillhost_edit(text ggml-cpu/ops.cpp
        "static void ggml_compute_forward_flash_attn_ext_f16(\n"
        "${SKILLHOST_FA_ROWS}\nstatic void ggml_compute_forward_flash_attn_ext_f16(\n")
    # The kernel takes each thread's share of rows whole rather than ggml's
    # chunks of them, so that rows reading the same K and V run together.
    skillhost_edit(text ggml-cpu/ops.cpp
        "        int current_chunk = ith;\n\n        while (current_chunk < nchunk) {\n"
        "        int current_chunk = ith;\n\n        if (!use_tiled && !use_ref && skillhost_fa_rows_fit(dst)) {\n            const int64_t share = (nr + nth - 1)/nth;\n            skillhost_fa_rows(params, dst, std::min(nr, ith*share), std::min(nr, (ith + 1)*share));\n            current_chunk = nchunk;\n        }\n\n        while (current_chunk < nchunk) {\n")
    file(WRITE "${out}/ggml-cpu-ops.cpp" "${text}")
    skillhost_use_copies(ggml-cpu "${out}" "${ggml_cpu_ops}")

    # The hash of this file followed by the kernel's, as the Makefile takes it.
    file(READ "${SKILLHOST_LLAMA_PATCH_FILE}" this)
    string(SHA256 hash "${this}${SKILLHOST_FA_ROWS}")
    file(WRITE "${CMAKE_BINARY_DIR}/skillhost-llama-patch.sha256" "${hash}\n")
endfunction()

cmake_language(DEFER CALL skillhost_patch_llama)
